"""Run a script as N cooperating JAX processes on this machine, like ``torchrun``.

``python -m snnjax.launch --nproc N [--devices-per-proc K] [--port P] SCRIPT [ARGS...]``
starts N copies of ``python SCRIPT ARGS`` and tells process k (0..N-1) its place through the
environment, which :func:`snnjax.distributed.initialize` reads (``train.py`` calls it):
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
it). SIGINT and SIGTERM are passed on to all processes, and SIGKILL follows ``--grace-s``
seconds later, or at a second signal. When one exits with an error, the others
get SIGTERM, then SIGKILL after ``--grace-s`` seconds, and the launcher exits with that
process's code (128 + signal if a signal ended it), naming its rank; 0 when all succeed.
Each process runs in its own process group (killed as a group) and, on Linux, is killed if
the launcher itself dies.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from snnjax.distributed import ENV_COLLECTIVE_TIMEOUT, ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

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
    p.add_argument("--grace-s", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping the processes (default 5)")
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


class Launcher:
    """Starts, watches and stops the processes; ``run()`` returns the exit code."""

    def __init__(self, cmd: list[str], envs: list[dict[str, str]], grace_s: float):
        self.cmd, self.envs, self.grace_s = cmd, envs, grace_s
        self.procs: list[subprocess.Popen] = []
        self.signalled: int | None = None
        self._kill_at: float | None = None

    def _signal_all(self, sig: int, procs=None) -> None:
        for p in self.procs if procs is None else procs:
            try:
                os.killpg(p.pid, sig)  # the group of the child (its pid: start_new_session)
            except (ProcessLookupError, PermissionError):
                pass

    def _on_signal(self, signum, frame) -> None:
        if self.signalled is not None:  # a second Ctrl-C: no more waiting
            self._signal_all(signal.SIGKILL)
            return
        self.signalled = signum
        self._signal_all(signum)
        self._kill_at = time.monotonic() + self.grace_s

    def _stop(self) -> None:
        """SIGTERM the running processes, SIGKILL what is left after the grace period, and reap them."""
        running = [p for p in self.procs if p.poll() is None]
        self._signal_all(signal.SIGTERM, running)
        deadline = time.monotonic() + self.grace_s
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)  # also any leftover members of finished groups
        for p in self.procs:
            p.wait()

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        output = _Output()
        pumps = []
        try:
            launcher_pid = os.getpid()
            for env in self.envs:  # all forks before any thread starts
                self.procs.append(subprocess.Popen(
                    self.cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True, preexec_fn=lambda: _die_with_launcher(launcher_pid)))
            for rank, p in enumerate(self.procs):
                prefix = f"[rank {rank}] ".encode()
                pumps += [_Prefixer(p.stdout, sys.stdout.buffer, prefix, output),
                          _Prefixer(p.stderr, sys.stderr.buffer, prefix, output)]
            for pump in pumps:
                pump.thread.start()
            failed = self._watch()
        finally:
            if self.procs:
                self._stop()
            for pump in pumps:
                pump.thread.join(timeout=2.0)
            for s, handler in previous.items():
                signal.signal(s, handler)
        n = len(self.procs)
        if output.last != b"\n":  # a progress bar left the line open
            print(file=sys.stderr)
        if failed is not None:
            rank, code = failed
            how = f"exited with code {code}" if code > 0 else f"was killed by {signal.Signals(-code).name}"
            stopped = f"; stopped the other {n - 1} process{'es' if n > 2 else ''}" if n > 1 else ""
            print(f"launch: rank {rank} {how}{stopped}", file=sys.stderr, flush=True)
            return code if code > 0 else 128 - code
        if self.signalled is not None:
            print(f"launch: stopped all {n} processes on {signal.Signals(self.signalled).name}", file=sys.stderr,
                  flush=True)
            return 128 + self.signalled
        return 0

    def _watch(self) -> tuple[int, int] | None:
        """Wait until all processes succeed (None) or the first fails (its ``(rank, returncode)``)."""
        while True:
            codes = [p.poll() for p in self.procs]
            for rank, code in enumerate(codes):
                if code not in (None, 0) and self.signalled is None:
                    return rank, code
            if all(code is not None for code in codes):
                return None
            if self._kill_at is not None and time.monotonic() > self._kill_at:
                self._signal_all(signal.SIGKILL)
                self._kill_at = None
            time.sleep(0.02)


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
    address = f"127.0.0.1:{a.port or free_port()}"
    envs = child_envs(nproc, a.devices_per_proc, gpus, address, a.collective_timeout_s, environ)
    devices = f"GPU(s) (of {','.join(gpus)})" if gpus else "CPU device(s)"
    print(f"launch: {nproc} processes x {a.devices_per_proc} {devices}, coordinator {address}", file=sys.stderr,
          flush=True)
    return Launcher([sys.executable, a.script, *a.args], envs, a.grace_s).run()


if __name__ == "__main__":
    sys.exit(main())
