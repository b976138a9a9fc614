"""Orbax checkpoints of the train state: periodic saves, keep-N, exact resume, clear errors.

A checkpoint holds the step, parameters, non-RNG model state (BatchNorm
statistics) and optimizer state, plus a JSON record of the run (config and
data position). RNG streams are not saved: the step functions derive all
randomness from ``(seed, step)``. Restoring never writes to the checkpoint
directory, so a failed resume leaves every checkpoint as it was.

Saves are asynchronous: orbax writes a step into ``<step>.orbax-checkpoint-tmp``
and renames it to ``<step>`` once complete, and deletes checkpoints beyond the
newest ``keep`` only after that. A write that fails (disk full, permissions)
surfaces when the save is waited for (``wait``, the next ``save``, ``close``) and
becomes a :class:`CheckpointError` naming the failed step and the complete
checkpoints left on disk, which the failure did not touch.
"""
from __future__ import annotations

import contextlib
import logging
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

_ITEMS = ("state", "meta")


@contextlib.contextmanager
def _quiet(enabled: bool):
    """Drop absl (orbax) warnings within the block when ``enabled``."""
    log = logging.getLogger("absl")
    level = log.level
    if enabled:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt, does not fit this run, or could not be written."""


def _saved_part(state) -> dict[str, Any]:
    return {"step": state.step, "params": state.params, "model_state": state.model_state,
            "opt_state": state.opt_state}


def complete_steps(directory: str | pathlib.Path) -> list[int]:
    """The steps with a complete checkpoint in ``directory``, as a fresh reader (a resumed run) sees them."""
    return sorted(ocp.path.step.checkpoint_steps(pathlib.Path(directory).absolute()))  # finalized, no tmp dirs


class Checkpointer:
    """Saves to and restores from ``directory`` (``WORKDIR/checkpoints``)."""

    def __init__(self, directory: str | pathlib.Path, keep: int = 3, *, read_only: bool = False):
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=None if read_only else keep, create=not read_only,
                                               read_only=read_only, save_interval_steps=0 if read_only else 1)
        with _quiet(read_only):  # orbax warns that a read-only manager's directory is read only
            self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)
        self._pending: int | None = None  # the step of a save not yet waited for

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, state, meta: dict[str, Any]) -> None:
        """Save ``state`` at its step (asynchronously; ``wait`` blocks until it is on disk).

        Raises:
          CheckpointError: the previous save or this one failed; no further save should be attempted.
        """
        self.wait()
        step = int(jax.device_get(state.step))
        try:
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_saved_part(state)),
                                                            meta=ocp.args.JsonSave(meta)))
        except Exception as e:  # orbax raises OSError, ValueError, ... for a write it cannot start
            raise self._save_failed(step, e) from e
        self._pending = step

    def wait(self) -> None:
        """Block until the last save is on disk; ``CheckpointError`` if writing it failed."""
        step, self._pending = self._pending, None
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # the background write's own error (OSError for a full disk, ...)
            raise self._save_failed(step, e) from e

    def _save_failed(self, step: int | None, error: Exception) -> CheckpointError:
        kept = complete_steps(self.directory)
        where = f"step {step}" if step is not None else "a step"
        left = (f"the complete checkpoints there, steps {kept} (latest {kept[-1]}), are intact: fix the cause "
                "(free disk space, write permission) and rerun the same command with --config.resume=True to "
                f"continue from step {kept[-1]}" if kept else
                "no complete checkpoint is there: fix the cause (free disk space, write permission) and rerun the "
                "same command (without --config.resume=True)")
        return CheckpointError(f"saving the checkpoint of {where} to {self.directory} failed: "
                               f"{type(error).__name__}: {error}. Training stopped; {left}.")

    def restore(self, state_template, step: int | None = None):
        """``(state, meta)`` from ``step`` (default: latest), shaped and sharded like ``state_template``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint found in {self.directory}; start without resume=True "
                                  "or point --workdir at the run to continue")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _saved_part(state_template))
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        except Exception as e:  # orbax raises many types for unreadable data
            raise CheckpointError(
                f"checkpoint {self.directory / str(step)} could not be restored (corrupt, incomplete, or from a "
                f"different model/optimizer): {type(e).__name__}: {e}. Nothing was changed; delete that step's "
                "folder to resume from an earlier checkpoint, or start a fresh run in a new workdir.") from e
        saved = restored["state"]
        state = state_template.replace(step=saved["step"], params=saved["params"],
                                       model_state=saved["model_state"], opt_state=saved["opt_state"])
        return state, dict(restored["meta"])

    def restore_raw(self, step: int) -> dict[str, Any]:
        """The saved part of checkpoint ``step`` as nested dicts of arrays (no template: ``step``, ``params``,
        ``model_state``, ``opt_state``), for reading a model's weights without its optimizer."""
        one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # saved under any layout, read onto one
        try:
            with _quiet(True):  # orbax warns of a step-level metadata file it does not need here
                saved = ocp.StandardCheckpointer().metadata(self.directory / str(step) / "state").item_metadata
            abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), saved)
            restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                          meta=ocp.args.JsonRestore()))
        except Exception as e:  # orbax raises many types for unreadable data
            raise CheckpointError(f"checkpoint {self.directory / str(step)} could not be read (corrupt or "
                                  f"incomplete): {type(e).__name__}: {e}") from e
        return dict(restored["state"])

    def close(self) -> None:
        """Wait for the last save (``CheckpointError`` if it failed) and release the manager."""
        try:
            self.wait()
        except CheckpointError:
            with contextlib.suppress(Exception):  # the failure is reported above; release what is left
                self.manager.close()
            raise
        self.manager.close()
