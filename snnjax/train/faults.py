"""What stops a training run early: preemption signals and non-finite steps.

``StopSignals`` turns SIGTERM / SIGINT into a request the loop reads at each step
boundary (``Trainer`` then saves a checkpoint and raises ``Preempted``); a second
signal stops at once. ``NonFiniteError`` is raised for a NaN/inf loss or gradient
under ``config.nonfinite="stop"``, with ``inputs_note`` saying whether the batch
itself held NaN/inf inputs.
"""
from __future__ import annotations

import signal
import threading

import jax
import numpy as np

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
    """

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        self.received = None
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
            for s in STOP_SIGNALS:
                signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

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

    def agreed(self, done: int, every: int) -> int | None:
        """The signal to stop on after step ``done``, the same in every process.

        With several processes they compare at every ``every``-th step (one small all-gather) so that all
        stop after the same step.
        """
        if jax.process_count() == 1:
            return self.received
        if done % every:
            return None
        from jax.experimental import multihost_utils  # noqa: PLC0415 (only multi-process runs need it)

        signals = multihost_utils.process_allgather(np.int32(self.received or 0))
        return int(np.max(signals)) or None


def inputs_note(loader, data_name: str, done: int) -> str:
    """Whether this process's part of the batch of step ``done`` (1-based) held NaN/inf inputs, and which."""
    epoch, step = divmod(done - 1, loader.steps_per_epoch)
    indices, _ = loader.step_indices(epoch, step)
    inputs, _ = loader.source.read(indices)
    bad = np.unique(indices[~np.isfinite(inputs.reshape(len(indices), -1)).all(axis=1)])
    if not bad.size:
        return ("Its batch inputs are finite, so the model diverged: lower config.learning_rate or set "
                "config.grad_clip_norm.")
    files = getattr(loader.source, "files", None)
    named = [str(files[i]) for i in bad[:5]] if files is not None else [str(i) for i in bad[:5]]
    more = f" and {bad.size - 5} more" if bad.size > 5 else ""
    return (f"Its batch holds NaN/inf inputs (the usual cause): {data_name} training example(s) "
            f"{', '.join(named)}{more}.")
