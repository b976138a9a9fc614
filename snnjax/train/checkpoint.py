"""Orbax checkpoints of the train state: periodic saves, keep-N, exact resume, clear errors.

A checkpoint holds the step, parameters, non-RNG model state (BatchNorm
statistics) and optimizer state, plus a JSON record of the run (config and
data position). RNG streams are not saved: the step functions derive all
randomness from ``(seed, step)``. Restoring never writes to the checkpoint
directory, so a failed resume leaves every checkpoint as it was.
"""
from __future__ import annotations

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt, or does not fit this run."""


def _saved_part(state) -> dict[str, Any]:
    return {"step": state.step, "params": state.params, "model_state": state.model_state,
            "opt_state": state.opt_state}


class Checkpointer:
    """Saves to and restores from ``directory`` (``WORKDIR/checkpoints``)."""

    def __init__(self, directory: str | pathlib.Path, keep: int = 3, *, read_only: bool = False):
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only, read_only=read_only)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, state, meta: dict[str, Any]) -> None:
        """Save ``state`` at its step (asynchronously; ``wait`` blocks until it is on disk)."""
        step = int(jax.device_get(state.step))
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_saved_part(state)),
                                                        meta=ocp.args.JsonSave(meta)))

    def wait(self) -> None:
        self.manager.wait_until_finished()

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

    def close(self) -> None:
        self.manager.close()
