"""Soak run: a 2-process training job under random kills, ending bitwise equal to an uninterrupted one.

    python -m snnjax.bench.soak [--duration-s 600] [--mean-gap-s 20] [--seed 0] [--workdir DIR]
        [--nproc 2] [--devices-per-proc 4] [--hang-timeout-s 30] [--out soak.jsonl]

A benchmark run by hand (minutes), not a test. ``train.py`` trains ``configs/digits.py``'s MLP in float64
(fsdp_tp over ``--nproc`` processes x ``--devices-per-proc`` CPU devices, a constant learning rate, a
checkpoint every 25 steps, no logging in between) under ``python -m snnjax.launch --max-restarts 1000
--hang-timeout-s T``. For ``--duration-s`` seconds, after gaps drawn from an exponential distribution of mean
``--mean-gap-s``, one fault at a time hits the job, each kind equally likely:

* ``SIGKILL rank``: a random training process dies at once; the launcher restarts the job from its latest complete
  checkpoint;
* ``SIGTERM rank``: a random training process is preempted: all of them save the same step and exit 143, which
  the launcher (with no signal of its own) treats as a failure and restarts;
* ``SIGSTOP rank``: a random training process freezes; the launcher's hang detection (``--hang-timeout-s``)
  names it, kills it and restarts (a process frozen before any process finished a step cannot be told from a
  slow start: the soak continues it after twice the hang timeout, ``stops_continued``);
* ``SIGTERM launcher``: the whole job is preempted (exit 143); the soak starts the launcher again on the same
  workdir, which resumes from the latest complete checkpoint.

Then SIGTERM ends the job with a last checkpoint, of step S (the latest complete one). An uninterrupted job of
S steps on the same layout, in a fresh workdir, with no host sync before its end (``log_every_steps`` and
``checkpoint_every_steps`` beyond it: the loop's bound on steps in flight keeps gloo from deadlocking), gives the
reference; every array of the two step-S checkpoints (parameters, optimizer state, step) is compared bitwise.

One JSON line per run goes to stdout and ``--out``: ``duration_s`` (the faulty phase), ``faults`` (count by kind),
``restarts`` (the launchers' restarts of the job), ``launcher_starts`` and ``launcher_exits`` (exit codes),
``final_step``, ``bitwise_equal`` (and ``differing``: the arrays that are not), ``reference_s``, ``wall_s``,
``load_avg`` (the 1-minute load average at the start and end), the commit and the jax version.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from snnjax.bench.common import append_jsonl, git_commit
from snnjax.runtime import launch

ROOT = pathlib.Path(__file__).resolve().parents[2]
KINDS = ("SIGKILL rank", "SIGTERM rank", "SIGSTOP rank", "SIGTERM launcher")
NEVER = 10**9  # a logging / evaluation / checkpoint interval no run reaches
JOB = {"dtype": "float64", "schedule": "constant", "eval_every_steps": NEVER, "log_every_steps": NEVER,
       "keep_checkpoints": 3, "model.hidden": "(64,)", "parallel.mode": "fsdp_tp", "parallel.mesh": "fsdp=-1,tensor=2"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m snnjax.bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=600.0, help="how long faults are injected (default 600)")
    p.add_argument("--mean-gap-s", type=float, default=20.0, help="mean seconds between faults (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    p.add_argument("--workdir", default=None, help="where both jobs write (default: a temporary directory, removed)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--devices-per-proc", type=int, default=4)
    p.add_argument("--hang-timeout-s", type=float, default=30.0, help="the launcher's --hang-timeout-s (default 30)")
    p.add_argument("--checkpoint-every", type=int, default=25, help="the faulty job's checkpoint interval")
    p.add_argument("--out", default=None, help="append the JSON record to this file too")
    a = p.parse_args(argv)
    for name in ("duration_s", "mean_gap_s", "hang_timeout_s"):
        if not getattr(a, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(a, name)}")
    if a.nproc < 2:
        p.error(f"--nproc must be >= 2 (a multi-process job), got {a.nproc}")
    return a


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES",
                                                                     "JAX_PROCESS_ID", "SLURM_", "SNNJAX_"))}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _launcher(a: argparse.Namespace, workdir: pathlib.Path, out: pathlib.Path, *, num_steps: int,
              checkpoint_every: int, resume: bool, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    flags = {**JOB, "num_steps": num_steps, "checkpoint_every_steps": checkpoint_every, "resume": resume}
    cmd = [sys.executable, "-m", "snnjax.runtime.launch", "--nproc", str(a.nproc), "--devices-per-proc",
           str(a.devices_per_proc), "--gpus", "none", *extra, str(ROOT / "train.py"), "--config",
           str(ROOT / "configs" / "digits.py"), *(f"--config.{k}={v}" for k, v in flags.items()),
           "--workdir", str(workdir)]
    with open(out, "a") as f:
        return subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _complete(workdir: pathlib.Path) -> list[int]:
    from snnjax.train.checkpoint import complete_steps  # noqa: PLC0415 (jax only once the jobs are started)

    return complete_steps(workdir / "checkpoints") if (workdir / "checkpoints").exists() else []


def _arrays(step_dir: pathlib.Path) -> dict:
    """Every array of the checkpoint in ``step_dir`` as numpy, by path."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    import orbax.checkpoint as ocp  # noqa: PLC0415

    jax.config.update("jax_enable_x64", True)
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(step_dir / "state")
    metadata = getattr(getattr(metadata, "item_metadata", metadata), "tree", metadata)
    restored = checkpointer.restore(step_dir / "state", restore_args=jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata))
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(restored)[0]}


class _Soak:
    """The faulty phase: keeps a launcher running on ``workdir`` and injects faults until ``deadline``."""

    def __init__(self, a: argparse.Namespace, workdir: pathlib.Path, log: pathlib.Path):
        self.a, self.workdir, self.log = a, workdir, log
        self.rng = random.Random(a.seed)
        self.faults: collections.Counter = collections.Counter()
        self.exits: list[int] = []
        self.starts = 0
        self.stops_continued = 0
        self.stopped: dict[int, float] = {}  # pid frozen by SIGSTOP: when
        self.preempted: subprocess.Popen | None = None  # a launcher sent SIGTERM: no more faults until it exits

    def start(self) -> subprocess.Popen:
        self.starts += 1
        return _launcher(self.a, self.workdir, self.log, num_steps=NEVER, checkpoint_every=self.a.checkpoint_every,
                         resume=bool(_complete(self.workdir)),
                         extra=("--max-restarts", "1000", "--hang-timeout-s", f"{self.a.hang_timeout_s:g}"))

    def _continue_frozen(self) -> None:
        """SIGCONT a process frozen for twice the hang timeout (before any step: the launcher cannot tell it)."""
        for pid, at in list(self.stopped.items()):
            if time.monotonic() - at > 2 * self.a.hang_timeout_s:
                with contextlib.suppress(ProcessLookupError):
                    if pathlib.Path(f"/proc/{pid}").exists():
                        os.kill(pid, signal.SIGCONT)
                        self.stops_continued += 1
                del self.stopped[pid]

    def _inject(self, kind: str, launcher: subprocess.Popen) -> bool:
        """Fault ``kind``; False if there was nothing to hit (no training process: the job between attempts)."""
        target = "the launcher"
        if kind == "SIGTERM launcher":
            launcher.send_signal(signal.SIGTERM)
            self.preempted = launcher
        else:
            ranks = launch.running_ranks(launcher.pid)
            if not ranks:
                return False
            rank = self.rng.choice(sorted(ranks))
            sig = {"SIGKILL rank": signal.SIGKILL, "SIGTERM rank": signal.SIGTERM, "SIGSTOP rank": signal.SIGSTOP}[kind]
            try:
                os.kill(ranks[rank], sig)
            except ProcessLookupError:
                return False
            if sig == signal.SIGSTOP:
                self.stopped[ranks[rank]] = time.monotonic()
            target = f"rank {rank}"
        self.faults[kind] += 1
        print(f"soak: {time.strftime('%H:%M:%S')} {kind} ({target}, launcher start {self.starts})", file=sys.stderr,
              flush=True)
        return True

    def run(self, duration_s: float) -> subprocess.Popen:
        """Inject faults for ``duration_s``; returns the launcher running at the end."""
        deadline = time.monotonic() + duration_s
        launcher = self.start()
        next_fault, kind = time.monotonic() + self.rng.expovariate(1 / self.a.mean_gap_s), self.rng.choice(KINDS)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            self._continue_frozen()
            if launcher.poll() is not None:
                self.exits.append(launcher.returncode)
                launcher = self.start()
            # One fault at a time: the kind drawn waits for a target (a training process, a launcher not preempted).
            if time.monotonic() >= next_fault and self.preempted is not launcher and self._inject(kind, launcher):
                next_fault = time.monotonic() + self.rng.expovariate(1 / self.a.mean_gap_s)
                kind = self.rng.choice(KINDS)
        return launcher

    def finish(self, launcher: subprocess.Popen) -> None:
        """Preempt the job for its last checkpoint (first continuing any frozen process) and wait for it."""
        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
        try:
            self.exits.append(launcher.wait(timeout=300))
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            self.exits.append(launcher.wait())


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    t0 = time.monotonic()
    load_start = os.getloadavg()[0]
    root = pathlib.Path(a.workdir) if a.workdir else pathlib.Path(tempfile.mkdtemp(prefix="snnjax-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    faulty, reference = root / "faulty", root / "reference"
    shutil.rmtree(faulty, ignore_errors=True)
    shutil.rmtree(reference, ignore_errors=True)
    try:
        soak = _Soak(a, faulty, root / "faulty.out")
        soak.finish(soak.run(a.duration_s))
        duration = time.monotonic() - t0
        log = (root / "faulty.out").read_text(errors="replace")
        steps = _complete(faulty)
        if not steps:
            raise SystemExit(f"soak: the faulty job left no complete checkpoint; see {root / 'faulty.out'}")
        final = steps[-1]
        t1 = time.monotonic()
        proc = _launcher(a, reference, root / "reference.out", num_steps=final, checkpoint_every=NEVER, resume=False)
        code = proc.wait()
        if code != 0:
            raise SystemExit(f"soak: the uninterrupted job of {final} steps exited {code}; see "
                             f"{root / 'reference.out'}")
        reference_s = time.monotonic() - t1
        got, want = _arrays(faulty / "checkpoints" / str(final)), _arrays(reference / "checkpoints" / str(final))
        import numpy as np  # noqa: PLC0415

        differing = sorted(k for k in want.keys() | got.keys()
                           if k not in got or k not in want or got[k].dtype != want[k].dtype
                           or not np.array_equal(got[k], want[k]))
        import jax  # noqa: PLC0415

        record = {"bench": "soak", "commit": git_commit(), "device_kind": "cpu", "jax_version": jax.__version__,
                  "duration_s": round(duration, 1),
                  "mean_gap_s": a.mean_gap_s, "seed": a.seed, "processes": a.nproc,
                  "devices_per_process": a.devices_per_proc, "hang_timeout_s": a.hang_timeout_s,
                  "faults": {k: soak.faults[k] for k in KINDS}, "stops_continued": soak.stops_continued,
                  "restarts": len(re.findall(r"launch: restart \d+ of", log)),
                  "launcher_starts": soak.starts, "launcher_exits": soak.exits, "final_step": final,
                  "arrays_compared": len(want), "bitwise_equal": not differing, "differing": differing,
                  "reference_s": round(reference_s, 1), "wall_s": round(time.monotonic() - t0, 1),
                  "load_avg": [round(load_start, 1), round(os.getloadavg()[0], 1)]}
    finally:
        if a.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(record), flush=True)
    append_jsonl(a.out, record)
    return record


if __name__ == "__main__":
    main()
