"""Run a script as N cooperating JAX processes on this machine, like ``torchrun``.

``python -m snnjax.launch --nproc N [--devices-per-proc K] [--port P] SCRIPT [ARGS...]``
starts N copies of ``python SCRIPT ARGS`` and tells process k (0..N-1) its place through the
environment, which :func:`snnjax.runtime.distributed.initialize` reads (``train.py`` calls it):
``JAX_COORDINATOR_ADDRESS=127.0.0.1:P`` (P: a free port unless given), ``JAX_NUM_PROCESSES=N``,
``JAX_PROCESS_ID=k`` and, with ``--collective-timeout-s``, ``SNNJAX_COLLECTIVE_TIMEOUT_S``.

* CPU (no GPU found, ``JAX_PLATFORMS=cpu``, or ``--gpus none``): each process gets K CPU
  devices (``--xla_force_host_platform_device_count=K`` in ``XLA_FLAGS``, the user's other
  XLA flags kept) and gloo collectives.
* GPU (``--gpus 0,1,..``, or found in ``CUDA_VISIBLE_DEVICES`` / ``nvidia-smi -L``): process k
  sees GPUs ``k*K .. k*K+K-1`` of that list through ``CUDA_VISIBLE_DEVICES``; N defaults to
  all of them.

Every line a process prints is prefixed ``[rank k] `` (stdout to stdout, stderr to stderr;
whole lines only, so processes' lines never mix; a ``\\r`` ends a line, as progress bars use
it). SIGINT and SIGTERM are passed on to all processes, and SIGKILL follows the grace period
later (``--grace-s`` plus twice the longest checkpoint write a process reported in its
heartbeat, so a preemption still saves where saves are slow), or at a second signal; the
launcher then exits with 128 + signal only if every process saved its checkpoint and exited
(``train.py`` exits 128 + signal after saving), else with ``EXIT_UNSAVED`` (125), naming the
processes killed or failed before saving. When one exits with an error, is killed, or
(``--hang-timeout-s``) finishes no step for that long (its Python stack is printed), the others
get SIGTERM, then SIGKILL after the grace period; with ``--max-restarts`` left, the job starts
again (``SNNJAX_ATTEMPT`` tells the processes, and ``train.py`` resumes from its latest
checkpoint), with one process fewer, down to ``--nproc-min``, when a process fails again before
the restarted job's first step. Otherwise the launcher exits with that process's code (128 +
signal if a signal ended it; ``EXIT_HUNG``, 124, if it hung), naming its rank; 0 when all
succeed. Each process runs in its own process group (killed as a group) and, on Linux, is
killed if the launcher itself dies.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

from snnjax.runtime import distributed
from snnjax.runtime.distributed import ENV_COLLECTIVE_TIMEOUT, ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

EXIT_HUNG = 124  # a process made no progress for --hang-timeout-s (as timeout(1) exits)
EXIT_UNSAVED = 125  # stopped on a signal, but some process was killed (or failed) before it saved
# The grace period before the first save's time is known: the digits config's last steps, first save and exit
# took 2.2-4.8 s in 7 of 8 runs on a 2-core machine at load average 20, and over 5 s in the eighth (docs/multihost.md).
GRACE_S = 10.0

_PR_SET_PDEATHSIG = 1
_LINE_ENDS = re.compile(rb"(?<=[\r\n])")  # splits after each line end, keeping it
# Resolved before any fork: the child calls it between fork and exec, where loading a library could deadlock.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform.startswith("linux") else None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m snnjax.launch", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=None,
                   help="processes to start (required on CPU; on GPU default: the GPUs / devices-per-proc)")
    p.add_argument("--devices-per-proc", type=int, default=1, metavar="K",
                   help="CPU devices per process, or GPUs per process (default 1)")
    p.add_argument("--port", type=int, default=0, help="coordinator port on 127.0.0.1 (default: a free one)")
    p.add_argument("--gpus", default="auto",
                   help="comma-separated GPU ids to spread over the processes, 'none' for CPU processes, or 'auto' "
                        "(default: CUDA_VISIBLE_DEVICES, else nvidia-smi -L, else CPU)")
    p.add_argument("--collective-timeout-s", type=float, default=None, metavar="T",
                   help="a collective waiting on a dead or stuck process fails after T seconds (default: jax's)")
    p.add_argument("--grace-s", type=float, default=GRACE_S,
                   help="seconds between SIGTERM and SIGKILL when stopping the processes, plus twice the longest a "
                        f"checkpoint took to write in this job (default {GRACE_S:g})")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="when a process fails (exits non-zero, is killed, or hangs), stop the rest and restart the "
                        "job up to N times; the script resumes from its latest complete checkpoint (default 0)")
    p.add_argument("--nproc-min", type=int, default=None, metavar="M",
                   help="when a process fails again at a restart (before any step), restart with one process fewer, "
                        "down to M (default: --nproc, never fewer)")
    p.add_argument("--hang-timeout-s", type=float, default=None, metavar="T",
                   help="a process that finishes no step for T seconds (after its first) is reported with its Python "
                        "stack and handled as failed (default: no hang detection)")
    p.add_argument("script", help="the Python script each process runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    a = p.parse_args(argv)
    if a.nproc is not None and a.nproc < 1:
        p.error(f"--nproc must be >= 1, got {a.nproc}")
    if a.devices_per_proc < 1:
        p.error(f"--devices-per-proc must be >= 1, got {a.devices_per_proc}")
    if not 0 <= a.port < 65536:
        p.error(f"--port must be in 1..65535 (0: a free one), got {a.port}")
    if a.collective_timeout_s is not None and not a.collective_timeout_s > 0:
        p.error(f"--collective-timeout-s must be > 0, got {a.collective_timeout_s}")
    if a.grace_s < 0:
        p.error(f"--grace-s must be >= 0, got {a.grace_s}")
    if a.max_restarts < 0:
        p.error(f"--max-restarts must be >= 0, got {a.max_restarts}")
    if a.nproc_min is not None and not 1 <= a.nproc_min <= (a.nproc or a.nproc_min):
        p.error(f"--nproc-min must be in 1..--nproc ({a.nproc}), got {a.nproc_min}")
    if a.hang_timeout_s is not None and not a.hang_timeout_s > 0:
        p.error(f"--hang-timeout-s must be > 0, got {a.hang_timeout_s}")
    return a


def find_gpus(spec: str, environ: dict[str, str]) -> list[str]:
    """GPU ids to use (empty: run on the CPU) for ``--gpus spec``."""
    if spec == "none":
        return []
    if spec != "auto":
        ids = [g.strip() for g in spec.split(",") if g.strip()]
        if not ids:
            raise ValueError(f"--gpus {spec!r} names no GPU; give ids like 0,1 or 'none'")
        return ids
    platforms = environ.get("JAX_PLATFORMS", "").lower()
    if platforms and not any(p in platforms for p in ("cuda", "gpu", "rocm")):
        return []
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(listing.stdout.splitlines()) if line.startswith("GPU ")]


def child_envs(nproc: int, devices_per_proc: int, gpus: list[str], address: str,
               collective_timeout_s: float | None, environ: dict[str, str]) -> list[dict[str, str]]:
    """The environment of each process (rank order)."""
    envs = []
    for rank in range(nproc):
        env = dict(environ)
        env.update({ENV_COORDINATOR: address, ENV_NUM_PROCESSES: str(nproc), ENV_PROCESS_ID: str(rank),
                    "PYTHONUNBUFFERED": "1"})
        if collective_timeout_s is not None:
            env[ENV_COLLECTIVE_TIMEOUT] = repr(collective_timeout_s)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[rank * devices_per_proc:(rank + 1) * devices_per_proc])
        else:
            flags = [f for f in env.get("XLA_FLAGS", "").split()
                     if not f.startswith("--xla_force_host_platform_device_count=")]
            env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices_per_proc}"])
            env.setdefault("JAX_PLATFORMS", "cpu")
            env.setdefault("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
        envs.append(env)
    return envs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_launcher(launcher_pid: int) -> None:
    """In the child before exec: be killed when the launcher dies (Linux), and not start if it already has."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != launcher_pid:
        os._exit(1)


class _Output:
    """Our stdout and stderr, shared by the copying threads: one writer at a time, whole lines only."""

    def __init__(self):
        self.lock = threading.Lock()
        self.last = b"\n"  # the last byte written to either: a line a progress bar left open ends in "\r"

    def write(self, out, data: bytes) -> bool:
        """Write ``data`` to ``out``; False if ``out`` is gone (a closed pipe)."""
        with self.lock:
            try:
                out.write(data)
                out.flush()
            except OSError:
                return False
            self.last = data[-1:]
        return True


class _Prefixer:
    """Copies a child's stream to ours, ``[rank k] `` before every line.

    A ``\r`` ends a line too (progress bars redraw theirs so). Only whole lines are copied, so
    processes' lines never mix; a last line without an end is copied, ended, when the stream closes.
    """

    def __init__(self, stream, out, prefix: bytes, output: _Output):
        self.stream, self.out, self.prefix, self.output = stream, out, prefix, output
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _lines(self, data: bytes, after_cr: bool) -> tuple[bytes, bool]:
        out = []
        for line in _LINE_ENDS.split(data):
            if line and not (after_cr and line == b"\n"):  # the "\n" of "\r\n" ends the line "\r" ended
                out.append(self.prefix)
            out.append(line)
            after_cr = line[-1:] == b"\r" if line else after_cr
        return b"".join(out), after_cr

    def _run(self) -> None:
        pending, after_cr = b"", False
        while chunk := os.read(self.stream.fileno(), 65536):
            data = pending + chunk
            end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            pending = data[end:]
            if end and self.out is not None:
                text, after_cr = self._lines(data[:end], after_cr)
                if not self.output.write(self.out, text):
                    self.out = None  # keep draining, or the child blocks on a full pipe
        if pending and self.out is not None:
            self.output.write(self.out, self._lines(pending + b"\n", after_cr)[0])
        self.stream.close()


@dataclasses.dataclass
class Outcome:
    """How one attempt of the job ended."""

    kind: str  # "ok", "signal" (every process saved and exited on it), "unsaved" (a signal, not every one saved),
    #            "failed" (a process exited non-zero or was killed), "hung" (a process made no progress)
    rank: int | None = None  # the process that failed, hung, or (unsaved) was the first not to save
    code: int = 0  # the launcher's exit code for this outcome
    cause: str = ""  # one phrase: "rank 1 was killed by SIGKILL at step 37"
    started: bool = False  # some process reported a finished step (the attempt got past its start)
    resumed_step: int | None = None


def running_ranks(launcher_pid: int) -> dict[int, int]:
    """``{rank: pid}`` of the launcher ``launcher_pid``'s training processes running now (Linux: read from
    ``/proc``, each child's rank from its ``JAX_PROCESS_ID``); a fault injector's and a test's way to find them."""
    found = {}
    key = f"{ENV_PROCESS_ID}=".encode()
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) != launcher_pid:
                continue
            env = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for var in env:
            if var.startswith(key):
                found[int(var[len(key):])] = int(stat.parent.name)
    return found


def _how(code: int) -> str:
    return f"exited with code {code}" if code > 0 else f"was killed by {signal.Signals(-code).name}"


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T: SIGSTOP, a debugger), from /proc (False where there is none)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class Launcher:
    """Starts, watches, stops and restarts the processes; ``run()`` returns the exit code."""

    def __init__(self, cmd: list[str], envs_for: Callable[[int, list[int]], list[dict[str, str]]], slots: int,
                 grace_s: float, *, max_restarts: int = 0, nproc_min: int | None = None,
                 hang_timeout_s: float | None = None):
        self.cmd, self.envs_for, self.grace_s = cmd, envs_for, grace_s
        self.slots = list(range(slots))  # device groups in use: rank k runs on slot slots[k]
        self.max_restarts, self.hang_timeout_s = max_restarts, hang_timeout_s
        self.nproc_min = slots if nproc_min is None else nproc_min
        self.procs: list[subprocess.Popen] = []
        self.signalled: int | None = None
        self._signal_at: float | None = None
        self._killed = False  # the SIGKILL after a signal's grace period was sent
        self.save_s = 0.0  # the longest checkpoint write a process reported (heartbeat save_s), in any attempt
        self.output = _Output()

    def _signal_all(self, sig: int, procs=None) -> None:
        for p in self.procs if procs is None else procs:
            try:
                os.killpg(p.pid, sig)  # the group of the child (its pid: start_new_session)
            except (ProcessLookupError, PermissionError):
                pass

    def grace(self) -> float:
        """Seconds from SIGTERM to SIGKILL: ``--grace-s`` plus twice the longest checkpoint write reported."""
        return self.grace_s + 2 * self.save_s

    def _grace_said(self, after: str = "") -> str:
        """The grace period in words: ``10 s after SIGTERM (--grace-s)``, or with the saves' share ``13.2 s after
        SIGTERM (--grace-s 10 + twice the slowest save, 1.6 s)``."""
        why = (f"--grace-s {self.grace_s:g} + twice the slowest save, {self.save_s:.2g} s" if self.save_s else
               "--grace-s")
        return f"{self.grace():.3g} s{' after ' + after if after else ''} ({why})"

    def _on_signal(self, signum, frame) -> None:
        if self.signalled is not None:  # a second Ctrl-C: no more waiting
            self._signal_all(signal.SIGKILL)
            return
        self.signalled = signum
        self._signal_at = time.monotonic()
        self._signal_all(signum)

    def _stop(self) -> None:
        """SIGTERM the running processes, SIGKILL what is left after the grace period, and reap them."""
        running = [p for p in self.procs if p.poll() is None]
        self._signal_all(signal.SIGTERM, running)
        deadline = time.monotonic() + self.grace()
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)  # also any leftover members of finished groups
        for p in self.procs:
            p.wait()

    def _say(self, message: str) -> None:
        with self.output.lock:
            if self.output.last != b"\n":  # a progress bar left the line open
                sys.stderr.buffer.write(b"\n")
            sys.stderr.buffer.write(message.encode() + b"\n")
            sys.stderr.buffer.flush()
            self.output.last = b"\n"

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        workspace = tempfile.mkdtemp(prefix="snnjax-launch-")
        history: list[dict] = []
        try:
            for attempt in itertools.count():
                directory = pathlib.Path(workspace) / f"attempt{attempt}"
                directory.mkdir()
                outcome = self._attempt(attempt, directory, history)
                if history and history[-1]["resumed_step"] is None:
                    history[-1]["resumed_step"] = outcome.resumed_step
                if history and not history[-1].get("said"):
                    self._say_restart(history[-1], outcome)
                if outcome.kind in ("ok", "signal", "unsaved") or self.signalled is not None:
                    return outcome.code
                if len(history) >= self.max_restarts:
                    if self.max_restarts:
                        self._say(f"launch: no restart left (--max-restarts {self.max_restarts}); exiting with "
                                  f"code {outcome.code}")
                    return outcome.code
                n = len(self.slots)
                if attempt > 0 and not outcome.started and n > self.nproc_min and outcome.rank is not None:
                    del self.slots[outcome.rank]  # it failed again at the restart: go on without its devices
                history.append({"attempt": attempt + 1, "processes": len(self.slots), "cause": outcome.cause,
                                "resumed_step": None})
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            shutil.rmtree(workspace, ignore_errors=True)

    def _say_restart(self, record: dict, outcome: Outcome) -> None:
        record["said"] = True
        resumed = (f"resumed at step {record['resumed_step']}" if record["resumed_step"] is not None else
                   "ended before its first step")
        self._say(f"launch: restart {record['attempt']} of {self.max_restarts} after {record['cause']}: "
                  f"{record['processes']} process{'es' if record['processes'] > 1 else ''}, {resumed}")

    def _attempt(self, attempt: int, directory: pathlib.Path, history: list[dict]) -> Outcome:
        envs = self.envs_for(attempt, self.slots)
        restarts = json.dumps([{k: v for k, v in r.items() if k != "said"} for r in history])
        for env in envs:
            env.update({distributed.ENV_ATTEMPT: str(attempt), distributed.ENV_HEARTBEAT_DIR: str(directory),
                        distributed.ENV_RESTARTS: restarts})
        self.procs, pumps = [], []
        outcome = Outcome("failed", code=1, cause="the launcher failed")
        try:
            launcher_pid = os.getpid()
            for env in envs:  # all forks before any thread starts
                self.procs.append(subprocess.Popen(
                    self.cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True, preexec_fn=lambda: _die_with_launcher(launcher_pid)))
            for rank, p in enumerate(self.procs):
                prefix = f"[rank {rank}] ".encode()
                pumps += [_Prefixer(p.stdout, sys.stdout.buffer, prefix, self.output),
                          _Prefixer(p.stderr, sys.stderr.buffer, prefix, self.output)]
            for pump in pumps:
                pump.thread.start()
            outcome = self._watch(directory, history)
        finally:
            if self.procs:
                self._stop()
            for pump in pumps:
                pump.thread.join(timeout=2.0)
        if outcome.kind == "signal":
            outcome = self._after_signal(directory)
        elif outcome.kind in ("failed", "hung"):
            n = len(self.procs)
            stopped = f"; stopped the other {n - 1} process{'es' if n > 2 else ''}" if n > 1 else ""
            self._say(f"launch: {outcome.cause}{stopped}")
        return outcome

    def _after_signal(self, directory: pathlib.Path) -> Outcome:
        """The outcome of a signal: 128 + signal only if every process saved the same step on it (and exited with
        128 + signal, or was killed only after its heartbeat said the checkpoint was on disk)."""
        sig, codes = self.signalled, [p.returncode for p in self.procs]
        name, n = signal.Signals(sig).name, len(codes)
        if all(code == 0 for code in codes):
            self._say(f"launch: {name} arrived, but all {n} processes had finished")
            return Outcome("ok", code=0)
        beats = [distributed.read_heartbeat(directory, rank) for rank in range(n)]
        saved = {rank: (beats[rank] or {}).get("saved") for rank in range(n)}
        lost, slow = [], []
        for rank, code in enumerate(codes):
            if code in (0, 128 + sig):
                continue
            (slow if saved[rank] is not None else lost).append((rank, code))
        steps = {saved[rank] for rank, code in enumerate(codes) if code != 0 and saved[rank] is not None}
        for rank, code in slow:
            self._say(f"launch: rank {rank} saved step {saved[rank]} on {name} but had not exited {self._grace_said()} "
                      f"after it; it {_how(code)}")
        if not lost and len(steps) <= 1:
            self._say(f"launch: stopped all {n} processes on {name}; each saved its checkpoint"
                      + (f" of step {steps.pop()}" if steps else "") + f" (exit code {128 + sig}: resumable)")
            return Outcome("signal", code=128 + sig)
        for rank, code in lost:
            why = (f"was killed by SIGKILL {self._grace_said(name)} before it saved its checkpoint"
                   if code == -signal.SIGKILL else f"{_how(code)} without saving its checkpoint")
            self._say(f"launch: stopped on {name}, but rank {rank} {why} (a process that saved exits with "
                      f"{128 + sig}); exit code {EXIT_UNSAVED}: a resumed run continues from an older checkpoint, "
                      "if any")
        if not lost:
            self._say(f"launch: stopped on {name}, but the processes saved different steps {sorted(steps)}; exit code "
                      f"{EXIT_UNSAVED}")
        return Outcome("unsaved", rank=lost[0][0] if lost else None, code=EXIT_UNSAVED)

    def _watch(self, directory: pathlib.Path, history: list[dict]) -> Outcome:
        """Wait until all processes succeed, one fails or hangs, or a signal's processes have all exited."""
        started, resumed, next_read = False, None, 0.0
        while True:
            codes = [p.poll() for p in self.procs]
            if self.signalled is not None:
                if all(code is not None for code in codes):
                    return Outcome("signal", started=started, resumed_step=resumed)
                if not self._killed and time.monotonic() > self._signal_at + self.grace():
                    self._signal_all(signal.SIGKILL)
                    self._killed = True
            else:
                for rank, code in enumerate(codes):
                    if code not in (None, 0):
                        beats = [distributed.read_heartbeat(directory, r) for r in range(len(self.procs))]
                        started, beat = started or any(beats), beats[rank]
                        at = f" at step {beat['step']}" if beat else ""
                        return Outcome("failed", rank=rank, code=code if code > 0 else 128 - code,
                                       cause=f"rank {rank} {_how(code)}{at}", started=started, resumed_step=resumed)
                if all(code is not None for code in codes):
                    return Outcome("ok", started=started, resumed_step=resumed)
            if time.monotonic() >= next_read:
                next_read = time.monotonic() + 0.25
                beats = [distributed.read_heartbeat(directory, rank) for rank in range(len(self.procs))]
                self.save_s = max([self.save_s] + [b.get("save_s") or 0.0 for b in beats if b])
                if any(beats) and not started:
                    started = True
                    resumed = min(b["start"] for b in beats if b)
                    if history and not history[-1].get("said"):
                        history[-1]["resumed_step"] = resumed
                        self._say_restart(history[-1], Outcome("ok"))
                if self.hang_timeout_s is not None and self.signalled is None:
                    hung = self._hung(beats, codes, directory)
                    if hung is not None:
                        return dataclasses.replace(hung, started=started, resumed_step=resumed)
            time.sleep(0.02)

    def _hung(self, beats: list[dict | None], codes: list[int | None], directory: pathlib.Path) -> Outcome | None:
        """Once a process has made no progress for ``hang_timeout_s``: the one to blame (its stack printed), else
        None."""
        now = time.time()
        waited = max((now - b["time"] for rank, b in enumerate(beats) if b and codes[rank] is None), default=0.0)
        if waited <= self.hang_timeout_s:
            return None
        # A stopped process (SIGSTOP, a debugger) first; then the one furthest behind: the others wait for it in
        # their collectives (one without a step yet counts as furthest behind).
        *_, rank = min((not _stopped(self.procs[rank].pid), b["step"] if b else -1, b["time"] if b else 0.0, rank)
                       for rank, b in enumerate(beats) if codes[rank] is None)
        since = beats[rank]["time"] if beats[rank] else 0.0
        where = (f"for {now - since:.0f} s after step {beats[rank]['step']}" if beats[rank] else
                 f"before its first step, while another waited {waited:.0f} s")
        stack = self._stack(rank, directory)  # one write with the line above: no other output between them
        self._say(f"launch: rank {rank} made no progress {where} (--hang-timeout-s {self.hang_timeout_s:g}); its "
                  f"Python stack:\n{stack}")
        self._signal_all(signal.SIGKILL, [self.procs[rank]])
        where = f"after step {beats[rank]['step']}" if beats[rank] else "before its first step"
        return Outcome("hung", rank=rank, code=EXIT_HUNG, cause=f"rank {rank} hung {where}")

    def _stack(self, rank: int, directory: pathlib.Path) -> str:
        """Rank ``rank``'s Python stack (faulthandler's dump on SIGUSR1, see distributed), prefixed by its rank."""
        path = directory / f"stack{rank}.txt"
        if not path.exists():
            return f"[rank {rank}] (no stack: the process did not call snnjax.runtime.distributed.initialize)"
        pid = self.procs[rank].pid
        os.kill(pid, distributed.STACK_SIGNAL)
        os.kill(pid, signal.SIGCONT)  # a stopped process runs its handler only once continued
        text, deadline = "", time.monotonic() + 3.0
        while time.monotonic() < deadline:  # faulthandler writes the whole dump at once, without a marker at its end
            time.sleep(0.2)
            now = path.read_text(errors="replace")
            if now and now == text:
                break
            text = now
        lines = text.rstrip("\n").splitlines() or ["(the process wrote no stack within 3 s)"]
        return "\n".join(f"[rank {rank}] {line}" for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    environ = dict(os.environ)
    try:
        gpus = find_gpus(a.gpus, environ)
    except ValueError as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2
    if gpus:
        nproc = a.nproc if a.nproc is not None else len(gpus) // a.devices_per_proc
        if nproc < 1 or nproc * a.devices_per_proc > len(gpus):
            print(f"launch: error: {nproc} processes x {a.devices_per_proc} GPUs need {nproc * a.devices_per_proc} "
                  f"GPUs but {len(gpus)} are available ({','.join(gpus)}); lower --nproc or --devices-per-proc, or "
                  "pass --gpus none to run on the CPU", file=sys.stderr)
            return 2
    elif a.nproc is None:
        print("launch: error: --nproc is required on the CPU (no GPU found)", file=sys.stderr)
        return 2
    else:
        nproc = a.nproc
    if not os.path.isfile(a.script):
        print(f"launch: error: script {a.script!r} not found", file=sys.stderr)
        return 2
    first = f"127.0.0.1:{a.port or free_port()}"

    def envs_for(attempt: int, slots: list[int]) -> list[dict[str, str]]:
        """Each process's environment in ``attempt`` (a fresh coordinator port unless --port), on ``slots``."""
        address = first if attempt == 0 else f"127.0.0.1:{a.port or free_port()}"
        k = a.devices_per_proc
        slot_gpus = [g for s in slots for g in gpus[s * k:(s + 1) * k]]
        return child_envs(len(slots), k, slot_gpus, address, a.collective_timeout_s, environ)

    devices = f"GPU(s) (of {','.join(gpus)})" if gpus else "CPU device(s)"
    elastic = (f"; up to {a.max_restarts} restart(s)" + (f", down to {a.nproc_min} process(es)"
                                                           if a.nproc_min is not None and a.nproc_min < nproc else "")
               if a.max_restarts else "")
    print(f"launch: {nproc} processes x {a.devices_per_proc} {devices}, coordinator {first}{elastic}",
          file=sys.stderr, flush=True)
    return Launcher([sys.executable, a.script, *a.args], envs_for, nproc, a.grace_s, max_restarts=a.max_restarts,
                    nproc_min=a.nproc_min, hang_timeout_s=a.hang_timeout_s).run()

if __name__ == "__main__":
    sys.exit(main())
