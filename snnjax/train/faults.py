"""What stops a training run early: preemption signals and non-finite steps.

``StopSignals`` turns SIGTERM / SIGINT into a request the loop reads at each step
boundary (``Trainer`` then saves a checkpoint and raises ``Preempted``); a second
signal stops at once. Several processes agree on the step to stop after within a
few steps of the signal (``_Agreement``). ``NonFiniteError`` is raised for a NaN/inf loss or gradient
under ``config.nonfinite="stop"``, with ``inputs_note`` saying whether the batch
itself held NaN/inf inputs.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time

import jax
import numpy as np

from snnjax.runtime import distributed

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """SIGTERM or SIGINT stopped the run after a checkpoint of ``step`` was written; resume continues it."""

    def __init__(self, message: str, *, signum: int, step: int):
        super().__init__(message)
        self.signum = signum
        self.step = step

    @property
    def exit_code(self) -> int:
        """``128 + signum`` (143 for SIGTERM, 130 for SIGINT), the shell's code for death by that signal."""
        return 128 + self.signum


class NonFiniteError(RuntimeError):
    """A step's loss or gradient norm was NaN/inf under ``config.nonfinite="stop"``; nothing after it was saved."""


class StopSignals:
    """A context in which SIGTERM / SIGINT only set ``received``; leaving it restores the previous handlers.

    A second signal restores those handlers and re-delivers itself (stop at once). Python runs signal
    handlers in the main thread only, so entered from another thread this changes nothing.

    With several processes, ``agreed`` makes them stop after the same step within a few steps of a
    signal reaching any of them, whatever the logging interval, through the key-value store of
    ``jax.distributed`` (see ``_Agreement``); the loop never waits on the device for it. Under the
    launcher, a background thread also writes this process's heartbeat (``snnjax.runtime.distributed.Heartbeat``).
    """

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._watch: _Watch | None = None
        self._runs = 0  # the key-value store outlives a run: each run agrees under its own keys

    def __enter__(self) -> StopSignals:
        self.received = None
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
            for s in STOP_SIGNALS:
                signal.signal(s, self._handle)
        self._runs += 1
        client = _client() if jax.process_count() > 1 else None
        agreement = _Agreement(client, f"snnjax/stop/{self._runs}") if client is not None else None
        self._watch = _Watch(self, agreement, distributed.Heartbeat())
        return self

    def __exit__(self, *exc) -> None:
        self._restore()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    def _restore(self) -> None:
        previous, self._previous = self._previous, {}
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            self._restore()
            signal.raise_signal(signum)
            return
        self.received = signum

    def saved(self, step: int) -> None:
        """The checkpoint of ``step`` that the stop asked for is on disk: tell the launcher (heartbeat ``saved``)."""
        watch = self._watch
        if watch is not None and watch.heartbeat.path is not None:
            watch.heartbeat.saved = step
            watch.heartbeat.write(watch.start if watch.start is not None else step, watch.step, watch.time)

    def save_took(self, seconds: float) -> None:
        """A checkpoint took ``seconds`` to write: the heartbeat's ``save_s`` keeps the longest, for the launcher's
        grace period (from any thread)."""
        watch = self._watch
        if watch is not None and seconds > watch.heartbeat.save_s:
            watch.heartbeat.save_s = seconds
            watch.dirty = True

    def agreed(self, done: int, final: bool = False) -> int | None:
        """The signal to stop on after step ``done`` (1-based), the same step and signal in every process.

        Called once per step, after the step was dispatched; ``final``: the run's last step, where no
        process stops early (it only tells the others it goes no further).
        """
        watch = self._watch
        if watch is not None:
            watch.beat(done)
        if watch is None or watch.agreement is None:
            return None if final else self.received
        return watch.agreement.decide(done, self.received, final)

    def settle(self, done: int) -> int | None:
        """After the logging, evaluation and checkpoint of step ``done`` (not the last), before the next step: the
        signal to stop on if the processes agreed on ``done`` only now (then the caller saves ``done``), else None.
        May wait for the other processes to say how far they got (several processes only)."""
        watch = self._watch
        if watch is None or watch.agreement is None:
            return None
        return watch.agreement.settle(done, self.received)


def _client():
    """The running ``jax.distributed`` job's key-value store client (jax has no public accessor)."""
    from jax._src import distributed as jax_distributed  # noqa: PLC0415 (private: only multi-process runs need it)

    return jax_distributed.global_state.client


class _Agreement:
    """Which step every process stops after, agreed through the coordinator's key-value store.

    Keys under ``prefix``: ``signal/<rank>`` (a process received a stop signal), ``seen/<rank>`` =
    ``"step,signal"`` (the step at which that process's loop first saw the request: it runs no
    step past the agreed one), and ``at/<rank>`` (a process's step as its background thread last
    saw it, published once any stop is requested). The agreed step is the largest ``seen`` step.
    A process that saw the request runs on while some process is known to be further on (every
    ``at`` and ``seen`` is a step the agreed one cannot be below), and waits only where none is,
    after its step's logging, evaluation and checkpoint (``settle``); then every process that has
    not seen the request is at or behind it and not blocked on this one (a checkpoint barrier or
    an evaluation of this step has its part), so it reaches the check within a step. No step
    waits on the device or the store until a stop is requested; the polling of the store is the
    background thread's.
    """

    def __init__(self, client, prefix: str):
        self.client, self.prefix = client, prefix
        self.rank, self.count = jax.process_index(), jax.process_count()
        self.entries: dict[str, str] = {}  # the store under ``prefix``, as last read
        self._signalled = False  # this process's signal key is set
        self._seen: int | None = None  # the step this process stopped advancing the agreement at
        self._at = -1
        self._stop: tuple[int, int] | None = None  # (agreed step, signal) once every process has seen the request

    def poll(self, step: int, received: int | None) -> None:
        """Background thread: read the store, say this process received a signal, and publish its step."""
        if received is not None and not self._signalled:
            self._set("signal", str(received))
            self._signalled = True
        self.entries = dict(self.client.key_value_dir_get(self.prefix + "/"))
        if self._requested() and step > self._at:
            self._set("at", str(step))
            self._at = step

    def decide(self, done: int, received: int | None, final: bool) -> int | None:
        """At the boundary of step ``done``, before its logging, evaluation and checkpoint: never waits."""
        if self._stop is None and final:  # no process goes past the last step: say so, for any process waiting
            self._set("seen", f"{done},{received or 0}")
            return None
        if self._stop is None and self._notice(done, received):
            self._read()
        return self._decided(done, final)

    def settle(self, done: int, received: int | None) -> int | None:
        """After the boundary work of step ``done``, before the next step: wait while no process is known to be
        further on and not every process has seen the request. Processes that have not seen it are then at
        ``done`` or behind, and the work of this boundary (a checkpoint barrier, an evaluation) is done, so
        none of them is blocked on this one."""
        if self._stop is None and not self._notice(done, received):
            return None
        while self._stop is None:
            further = self._read()
            if self._stop is None and done < further:
                return None  # the agreed step is beyond this one
            if self._stop is None:
                time.sleep(0.005)
        return self._decided(done, False)

    def _notice(self, done: int, received: int | None) -> bool:
        """Whether a stop is requested; the first time, publish this process's signal and ``seen`` step."""
        if received is None and not self._requested():
            return False
        if received is not None and not self._signalled:
            self._set("signal", str(received))
            self._signalled = True
        if self._seen is None:
            known = [int(v) for k, v in self.entries.items() if "/signal/" in k]
            self._set("seen", f"{done},{received or max(known, default=0)}")
            self._seen = done
        return True

    def _read(self) -> int:
        """Read the store; set the agreed stop once every process has seen the request. Returns the furthest
        step known (every ``seen`` and ``at``): the agreed step is not below it."""
        self.entries = dict(self.client.key_value_dir_get(self.prefix + "/"))
        seen = [tuple(map(int, v.split(","))) for k, v in self.entries.items() if "/seen/" in k]
        if len(seen) == self.count:
            self._stop = (max(s for s, _ in seen), max(sig for _, sig in seen))
        return max([s for s, _ in seen] + [int(v) for k, v in self.entries.items() if "/at/" in k], default=-1)

    def _decided(self, done: int, final: bool) -> int | None:
        if self._stop is None or final:
            return None
        step, signum = self._stop
        return signum if done >= step else None

    def _requested(self) -> bool:
        return any("/signal/" in k for k in self.entries)

    def _set(self, kind: str, value: str) -> None:
        self.client.key_value_set(f"{self.prefix}/{kind}/{self.rank}", value, allow_overwrite=True)


class _Watch:
    """A background thread that polls the stop agreement and writes the heartbeat (every ``period`` seconds)."""

    def __init__(self, signals: StopSignals, agreement: _Agreement | None, heartbeat: distributed.Heartbeat,
                 period: float = 0.05):
        self.signals, self.agreement, self.heartbeat, self.period = signals, agreement, heartbeat, period
        self.start: int | None = None
        self.step, self.time = -1, 0.0
        self._written = (-1, 0.0)  # (step, when) of the last heartbeat written
        self.dirty = False  # the heartbeat changed besides the step (a save's time)
        self._closed = threading.Event()
        self.thread = None
        if agreement is not None or heartbeat.path is not None:
            self.thread = threading.Thread(target=self._run, name="snnjax-stop-watch", daemon=True)
            self.thread.start()

    def beat(self, done: int) -> None:
        if self.start is None:
            self.start = done - 1
        self.step, self.time = done, time.time()

    def _run(self) -> None:
        while not self._closed.wait(self.period):
            step = self.step
            if self.agreement is not None:
                with contextlib.suppress(Exception):  # the coordinator is gone: the job ends, and the loop says why
                    self.agreement.poll(step, self.signals.received)
            written_step, written_at = self._written
            now = time.monotonic()
            changed = step != written_step or self.dirty
            if self.start is not None and (changed or now - written_at > 1.0) and now - written_at > 0.2:
                self.dirty = False
                with contextlib.suppress(OSError):  # the launcher is gone (its directory with it)
                    self.heartbeat.write(self.start, step, self.time)
                self._written = (step, now)

    def close(self) -> None:
        self._closed.set()
        if self.thread is not None:
            self.thread.join(timeout=1.0)  # a daemon: never hold up a preempted process


def inputs_note(loader, data_name: str, done: int) -> str:
    """Whether this process's part of the batch of step ``done`` (1-based) held NaN/inf inputs, and which."""
    epoch, step = divmod(done - 1, loader.steps_per_epoch)
    indices, _ = loader.step_indices(epoch, step)
    inputs, _ = loader.source.read(indices, loader.example_keys(epoch, step))  # as the step read them
    bad = np.unique(indices[~np.isfinite(inputs.reshape(len(indices), -1)).all(axis=1)])
    if not bad.size:
        return ("Its batch inputs are finite, so the model diverged: lower config.learning_rate or set "
                "config.grad_clip_norm.")
    files = getattr(loader.source, "files", None)
    named = [str(files[i]) for i in bad[:5]] if files is not None else [str(i) for i in bad[:5]]
    more = f" and {bad.size - 5} more" if bad.size > 5 else ""
    return (f"Its batch holds NaN/inf inputs (the usual cause): {data_name} training example(s) "
            f"{', '.join(named)}{more}.")
