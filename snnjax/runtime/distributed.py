"""Multi-process runs: join this process to a ``jax.distributed`` job before JAX starts.

``initialize()`` takes its settings, in order, from its arguments; the environment
(``JAX_COORDINATOR_ADDRESS``, which jax itself also reads, and ``JAX_NUM_PROCESSES`` /
``JAX_PROCESS_ID``, which jax 0.10 takes only as arguments, so snnjax reads them;
``python -m snnjax.launch`` sets all three); or a cluster environment that jax detects
(SLURM, Open MPI, a Kubernetes Indexed Job with the ``kubernetes`` package, Cloud TPU: see
``jax._src.clusters``). With none of these it does nothing: a single process needs no coordinator.

A collective whose peer died or stopped answering ends the run with an error: with
``collective_timeout_s = T`` a CPU collective fails after waiting ``T`` seconds, a process
that stops sending heartbeats is declared dead after ``T`` seconds (on every backend), and
the exit barrier waits at most ``T`` seconds, so a broken job ends within about ``2 T``.
``T`` must exceed the longest a process may rightly wait for the others (a checkpoint
write, the end of the run on process 0). Left unset, jax's defaults apply (heartbeats
100 s, exit barrier 300 s, CPU collectives 30 min).

Under ``python -m snnjax.launch`` a process also learns (``launch_info()``) which attempt of
the job it is (``SNNJAX_ATTEMPT``: 0 first, then 1, 2, ... after restarts, or SLURM's
``SLURM_RESTART_COUNT`` after a requeue) and why the job was restarted before
(``SNNJAX_RESTARTS``, JSON); it writes a heartbeat (``Heartbeat``) that the launcher reads
to find a hung process, and dumps its Python stack to a per-rank file on SIGUSR1.
"""
from __future__ import annotations

import dataclasses
import faulthandler
import json
import math
import os
import pathlib
import re
import signal
import socket
import threading
import time

import jax

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_COLLECTIVE_TIMEOUT = "SNNJAX_COLLECTIVE_TIMEOUT_S"
ENV_ATTEMPT = "SNNJAX_ATTEMPT"  # 0, 1, 2, ...: restarts of the job so far
ENV_RESTARTS = "SNNJAX_RESTARTS"  # JSON list: one {"attempt", "processes", "cause", "resumed_step"} per restart
ENV_HEARTBEAT_DIR = "SNNJAX_HEARTBEAT_DIR"  # where rank k writes heartbeat{k}.json and, on SIGUSR1, stack{k}.txt
STACK_SIGNAL = signal.SIGUSR1
# Cluster environments whose process count is in the environment: a one-task job there
# (a shell inside `salloc`, say) stays a plain single process.
_PROCESS_COUNT_VARS = {"SlurmCluster": "SLURM_NTASKS", "OmpiCluster": "OMPI_COMM_WORLD_SIZE"}

_joined: tuple[str | None, int | None, int | None] | None = None  # what this module passed to jax


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_count: int | None = None,
               timeout_s: float = 300.0, collective_timeout_s: float | None = None) -> bool:
    """Join this process to a multi-process JAX job; True if it did, False for a single process.

    Call it first, before any JAX computation or device query (``jax.devices()``, creating an
    array, jitting): jax fixes its devices when its backend starts, and a process whose
    backend has started cannot join a job (``RuntimeError`` here if that happened). In a
    notebook, call it in the first cell; calling it again with the same settings is a no-op.

    Args:
      coordinator_address: ``host:port`` of process 0, which serves the coordinator there
        (default ``$JAX_COORDINATOR_ADDRESS``).
      num_processes: processes in the job (default ``$JAX_NUM_PROCESSES``).
      process_id: this process, ``0 <= process_id < num_processes`` (default ``$JAX_PROCESS_ID``).
        The three go together; give only some of them only in a cluster environment jax
        detects, which supplies the rest.
      local_device_count: CPU devices of this process (sets ``jax_num_cpu_devices``; the CPU
        backend only; applied to a single process too). Default: jax's (one, or
        ``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``).
      timeout_s: seconds to wait for all processes to connect.
      collective_timeout_s: seconds after which a cross-process collective or a silent peer
        is an error (see the module docstring; default ``$SNNJAX_COLLECTIVE_TIMEOUT_S``, else
        jax's defaults).
    """
    global _joined
    _dump_stack_on_signal()
    address = coordinator_address if coordinator_address is not None else os.environ.get(ENV_COORDINATOR) or None
    count = num_processes if num_processes is not None else _env_number(ENV_NUM_PROCESSES, int, "an integer")
    index = process_id if process_id is not None else _env_number(ENV_PROCESS_ID, int, "an integer")
    collective = (collective_timeout_s if collective_timeout_s is not None
                  else _env_number(ENV_COLLECTIVE_TIMEOUT, float, "a number of seconds"))
    _check_settings(address, count, index, local_device_count, timeout_s, collective)

    if jax.distributed.is_initialized():
        asked = (address, count, index)
        if _joined is not None and all(v is None or v == j for v, j in zip(asked, _joined, strict=True)):
            return True
        raise RuntimeError(f"jax.distributed is already initialised{' by another caller' if _joined is None else ''} "
                           f"(as {_describe(*(_joined or (None, None, None)))}); this call asks for "
                           f"{_describe(address, count, index)}. Initialise once per process: restart it to "
                           "join another job")
    if local_device_count is not None:
        _before_backend("set local_device_count")
        jax.config.update("jax_num_cpu_devices", int(local_device_count))

    given = [v is not None for v in (address, count, index)]
    cluster = None if all(given) else _detect_cluster()
    if not any(given) and cluster is None:
        return False
    if not all(given) and cluster is None:
        raise ValueError(f"coordinator_address, num_processes and process_id go together, but only "
                         f"{_describe(address, count, index)} is set; set all three (flags "
                         f"--coordinator_address=HOST:PORT --num_processes=N --process_id=K, or the environment "
                         f"variables {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}), or none for a "
                         "single process")
    if not any(given) and _cluster_process_count(cluster) == 1:
        return False
    if count == 1:  # a job of one process (the launcher's --nproc 1, or a job shrunk to one): nothing to join
        return False

    _before_backend("join a multi-process job")
    # CPU collectives across processes need an implementation: gloo is jax 0.10's default, older ones had none.
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeouts = {}
    if collective is not None:
        seconds = max(1, math.ceil(collective))
        _set_xla_flag("xla_cpu_collective_timeout_seconds", seconds)
        timeouts = {"heartbeat_timeout_seconds": seconds, "shutdown_timeout_seconds": seconds}
    if address is not None and index is not None and index > 0:
        _wait_for_coordinator(address, index, timeout_s)
    # With all three given, jax's cluster detection would still pick this process's GPUs from a scheduler's
    # variables (SLURM_LOCALID), overriding the CUDA_VISIBLE_DEVICES a launcher chose; "deactivate" stops it.
    # jax's preemption service catches SIGTERM in native code from here on; until the training loop installs its
    # handlers (snnjax.train.faults.StopSignals: the processes agree on a step, save it and exit 143) a SIGTERM
    # would then be swallowed, and the process killed only by the launcher's SIGKILL after its grace period.
    jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(address, count, index, initialization_timeout=max(1, math.ceil(timeout_s)),
                               cluster_detection_method="deactivate" if cluster is None else None, **timeouts)
    _joined = (address, count, index)
    return True


def _check_settings(address, count, index, local_device_count, timeout_s, collective) -> None:
    if address is not None and not re.fullmatch(r"\[?[\w.\-:]+\]?:\d{1,5}", address):
        raise ValueError(f"coordinator_address must be HOST:PORT (process 0's address), got {address!r}")
    if address is not None and not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise ValueError(f"coordinator_address {address!r}: the port must be in 1..65535")
    for name, v in (("num_processes", count), ("process_id", index), ("local_device_count", local_device_count)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"{name} must be an integer, got {v!r}")
    if count is not None and count < 1:
        raise ValueError(f"num_processes must be >= 1, got {count}")
    if index is not None and index < 0:
        raise ValueError(f"process_id must be >= 0, got {index}")
    if count is not None and index is not None and index >= count:
        raise ValueError(f"process_id={index} is not below num_processes={count}: processes are numbered "
                         f"0..{count - 1}")
    if local_device_count is not None and local_device_count < 1:
        raise ValueError(f"local_device_count must be >= 1, got {local_device_count}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if collective is not None and not collective > 0:
        raise ValueError(f"collective_timeout_s must be > 0 seconds, got {collective}")


def _env_number(name: str, kind: type, what: str):
    """``kind(os.environ[name])``, or None when unset or empty; ValueError naming the variable otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not {what}") from None


def _describe(address, count, index) -> str:
    parts = [f"{n}={v!r}" for n, v in (("coordinator_address", address), ("num_processes", count),
                                      ("process_id", index)) if v is not None]
    return ", ".join(parts) or "nothing"


def _detect_cluster():
    """The cluster environment jax would use (jax's own detection order), or None."""
    from jax._src import clusters  # noqa: PLC0415 (private: jax has no public detection; only needed here)

    for env in clusters.ClusterEnv._cluster_types:
        # jax counts every Kubernetes pod as a job (and warns where the kubernetes package is missing); only an
        # Indexed Job, whose pods have a JOB_COMPLETION_INDEX, runs one process per pod.
        if env.__name__ == "K8sCluster" and "JOB_COMPLETION_INDEX" not in os.environ:
            continue
        if not env.opt_in_only_method and env.is_env_present():
            return env
    return None


def _cluster_process_count(cluster) -> int | None:
    var = _PROCESS_COUNT_VARS.get(cluster.__name__)
    raw = os.environ.get(var, "") if var else ""
    return int(raw) if raw.isdigit() else None


def _before_backend(what: str) -> None:
    from jax._src import xla_bridge  # noqa: PLC0415 (private: jax has no public check)

    if xla_bridge.backends_are_initialized():
        raise RuntimeError(f"cannot {what}: JAX's backend in this process has already started (something computed, "
                           "made an array or asked for jax.devices()). Call snnjax.runtime.initialize() before "
                           "any JAX computation (in a notebook: restart the kernel, call it in the first cell)")


def _wait_for_coordinator(address: str, index: int, timeout_s: float) -> None:
    """Wait until process 0's coordinator port accepts connections (jax aborts the process if it never does)."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"process {index} could not reach the coordinator at {address} within {timeout_s:g} "
                                   f"s ({e}); start process 0, which serves it, with the same coordinator address, and "
                                   "check that this host can reach that host and port") from None
            time.sleep(0.2)


def _set_xla_flag(name: str, value: int) -> None:
    """Set ``--name=value`` in ``XLA_FLAGS`` (replacing any), read when the backend starts."""
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(f"--{name}=")]
    os.environ["XLA_FLAGS"] = " ".join([*kept, f"--{name}={value}"])


# -- the launcher's side channel ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """What the launcher (or SLURM) tells a process about earlier attempts of its job."""

    attempt: int  # 0 on the first start; n after n restarts (or SLURM requeues)
    restarts: tuple[dict, ...]  # one record per launcher restart: attempt, processes, cause, resumed_step

    @property
    def restarted(self) -> bool:
        """True when an earlier attempt ran: the job continues from its latest complete checkpoint."""
        return self.attempt > 0


def launch_info() -> LaunchInfo:
    """This process's attempt (``$SNNJAX_ATTEMPT``, else ``$SLURM_RESTART_COUNT``, else 0) and restart records."""
    attempt = _env_number(ENV_ATTEMPT, int, "an integer")
    if attempt is None:
        attempt = _env_number("SLURM_RESTART_COUNT", int, "an integer") or 0
    raw = os.environ.get(ENV_RESTARTS, "").strip()
    try:
        restarts = tuple(json.loads(raw)) if raw else ()
    except ValueError:
        raise ValueError(f"environment variable {ENV_RESTARTS}={raw!r} is not a JSON list") from None
    return LaunchInfo(attempt, restarts)


def _rank() -> int:
    return _env_number(ENV_PROCESS_ID, int, "an integer") or 0


def _dump_stack_on_signal() -> None:
    """Under the launcher: on SIGUSR1, write every thread's Python stack to ``stack<rank>.txt`` (faulthandler runs
    in the signal handler itself, so it answers even while the main thread is blocked in native code)."""
    directory = os.environ.get(ENV_HEARTBEAT_DIR)
    if not directory or getattr(_dump_stack_on_signal, "file", None) is not None:
        return
    _dump_stack_on_signal.file = open(pathlib.Path(directory) / f"stack{_rank()}.txt", "w")  # noqa: SIM115 (kept open)
    faulthandler.register(STACK_SIGNAL, file=_dump_stack_on_signal.file, all_threads=True)


class Heartbeat:
    """Writes ``{"pid", "attempt", "start", "step", "time", "saved", "save_s"}`` to
    ``$SNNJAX_HEARTBEAT_DIR/heartbeat<rank>.json``.

    ``step`` is the last step this process finished dispatching, ``time`` when (Unix seconds), ``start`` the step
    the run began or resumed at, ``saved`` the step whose checkpoint a stop signal had it write (waited for), or
    None, ``save_s`` the longest a checkpoint of this run took to write (seconds; 0 before the first). Without the
    launcher's directory it writes nothing.
    """

    def __init__(self):
        directory = os.environ.get(ENV_HEARTBEAT_DIR)
        self.path = pathlib.Path(directory) / f"heartbeat{_rank()}.json" if directory else None
        self.attempt = launch_info().attempt if directory else 0
        self.saved: int | None = None
        self.save_s = 0.0
        self._lock = threading.Lock()  # the loop and its watching thread both write

    def write(self, start: int, step: int, at: float) -> None:
        if self.path is None:
            return
        record = {"pid": os.getpid(), "attempt": self.attempt, "start": start, "step": step, "time": at,
                  "saved": self.saved, "save_s": self.save_s}
        with self._lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.path)  # the launcher never reads half a record


def exit_now(code: int) -> None:
    """Exit with ``code`` at once: run the ``atexit`` handlers (jax's leaves the job cleanly), flush, and skip the
    interpreter's teardown, which can take seconds (a preempted process has little time between its signals)."""
    import atexit  # noqa: PLC0415
    import sys  # noqa: PLC0415

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def read_heartbeat(directory: str | pathlib.Path, rank: int) -> dict | None:
    """Rank ``rank``'s last heartbeat in ``directory``, or None if it has written none."""
    try:
        return json.loads((pathlib.Path(directory) / f"heartbeat{rank}.json").read_text())
    except (OSError, ValueError):
        return None
