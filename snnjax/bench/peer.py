"""Interleaved timing against a peer process (SpikingJelly's side of a comparison), repetition by repetition.

The two frameworks never share a process. The peer is a script (``spikingjelly_train_step.py``,
``spikingjelly_lif.py``) kept alive for the whole comparison and driven over its stdin / stdout, one JSON
object per line:

- once started it prints a ``ready`` object: its versions, thread counts, backend;
- each request ``{"op": NAME, ...}`` is answered by one object, ``{"error": MESSAGE}`` if the handler
  raised; ``{"op": "time"}`` runs one timed repetition and answers ``{"ms": ...}``, timed inside the peer
  (the pipe's round trip is not counted);
- it exits at ``{"op": "quit"}`` or the end of its input.

``interleave`` then alternates one repetition of each side (the order flipping every repetition), so slow
drifts of a shared machine's load hit both sides alike. NumPy-free and JAX-free: the peer imports this file
as a sibling module of its script.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))


class PeerError(RuntimeError):
    """The peer failed to start or answered a request with an error."""


class Peer:
    """A running peer script; ``ready`` holds its start-up object.

    ``wait=False`` returns as soon as the process is started (``ready`` None) so that the caller can work while the
    peer warms up; ``wait_ready()`` then reads its start-up object.
    """

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, wait: bool = True):
        self._stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty peer cannot block
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, env=env)
        self.ready = None
        if wait:
            self.wait_ready()

    def wait_ready(self) -> dict:
        """The peer's start-up object, read once (``PeerError`` if it failed to start)."""
        if self.ready is None:
            try:
                self.ready = self._read()
            except PeerError:
                self.close()
                raise
        return self.ready

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self._stderr.seek(0)
                lines = self._stderr.read().strip().splitlines() or [f"exited with {self.proc.returncode}"]
                raise PeerError(lines[-1])
            if line.startswith("{"):
                reply = json.loads(line)
                if "error" in reply:
                    raise PeerError(reply["error"])
                return reply

    def request(self, op: str, **kwargs) -> dict:
        """Send one request and return the peer's answer (``PeerError`` on an error answer)."""
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def time_once(self) -> float:
        """Milliseconds of one timed repetition in the peer."""
        return self.request("time")["ms"]

    def close(self) -> None:
        """Ask the peer to quit and wait for it."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_script(python: str, script: str, args: list[str], env: dict[str, str] | None = None,
                 wait: bool = True) -> Peer:
    """Run ``snnjax/bench/<script>`` by path under ``python`` (so the snnjax package, and JAX, stay unimported)."""
    return Peer([python, os.path.join(HERE, script), *args], env=env, wait=wait)


def interleave(timers: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Milliseconds of ``reps`` repetitions of each timer, taken in turn; the order reverses every repetition."""
    times: dict[str, list[float]] = {name: [] for name in timers}
    order = list(timers)
    for r in range(reps):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(timers[name]())
    return times


def timed_ms(call: Callable[[], object], inner: int = 1) -> float:
    """Milliseconds per call of ``inner`` calls of ``call()`` (it must block until its work is done)."""
    start = time.perf_counter()
    for _ in range(inner):
        call()
    return (time.perf_counter() - start) / inner * 1e3


def serve(handlers: dict[str, Callable[[dict], dict]], ready: dict) -> None:
    """The peer's side: print ``ready``, then answer requests from stdin until ``quit`` or the end of input."""
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        if op == "quit":
            break
        try:
            if op not in handlers:
                raise ValueError(f"unknown op {op!r}; this peer answers {', '.join(handlers)}")
            reply = handlers[op](request)
        except Exception as e:  # noqa: BLE001 (any failure goes back to the driver as its message)
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


def thread_info() -> dict:
    """This process's view of its CPU threads: cores it may run on and XLA's flags (XLA:CPU sizes its intra-op
    pool to the schedulable cores unless ``--xla_cpu_multi_thread_eigen=false``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    flags = os.environ.get("XLA_FLAGS", "")
    single = "--xla_cpu_multi_thread_eigen=false" in flags
    return {"cpu_count": os.cpu_count(), "schedulable_cores": cores, "xla_intra_op_threads": 1 if single else cores,
            "xla_flags": flags, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def keep_freed_memory() -> bool:
    """``snnjax.runtime.hostmem.keep_freed_memory()``, loaded by path (the package's ``__init__`` would import JAX)."""
    path = os.path.join(os.path.dirname(HERE), "runtime", "hostmem.py")
    spec = importlib.util.spec_from_file_location("_snnjax_hostmem", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.keep_freed_memory()
