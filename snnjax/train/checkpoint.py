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
becomes a :class:`CheckpointWriteError` naming the failed step and the complete
checkpoints left on disk, which the failure did not touch (``train.py`` then exits
with its ``exit_code``, 75: resumable, as after a preemption).

Integrity: before orbax renames a finished step into place, :data:`DIGEST` (``<step>/sha256.json``) is written
into it with the SHA-256 of every file of its ``state`` and ``meta`` items, so the digest is committed with the
step. :meth:`Checkpointer.restore` checks it before reading any array: a step whose files changed (a flipped
bit, a truncated or missing file) is refused, and a resume from the latest step falls back, with a warning
naming the damaged steps, to the newest step that checks out. Nothing is deleted: :func:`set_aside` renames the
damaged steps ``<step>.corrupt`` once a run continues from an earlier step, so the steps it saves again do not
collide with them. A step without a digest (written before digests were kept, or an old step a kill caught while
keep-N deleted it, file by file) restores unverified, and only when every newer step failed.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp

_ITEMS = ("state", "meta")
DIGEST = "sha256.json"  # in each step's folder: {path under the step: SHA-256 of the file}
_BLOCK = 1 << 20


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


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (disk full, permissions); the complete ones before it are intact, so the
    run stops as a preempted one does: resumable once the cause is fixed."""

    exit_code = 75  # train.py's exit status (EX_TEMPFAIL of sysexits.h: try again later), not a failure's 1


def _saved_part(state) -> dict[str, Any]:
    return {"step": state.step, "params": state.params, "model_state": state.model_state,
            "opt_state": state.opt_state}


def _file_digests(step_dir: pathlib.Path) -> dict[str, str]:
    """SHA-256 of every file under ``step_dir``'s item folders, keyed by its path relative to ``step_dir``."""
    out = {}
    for item in _ITEMS:
        for f in sorted((step_dir / item).rglob("*")):
            if f.is_file():
                h = hashlib.sha256()
                with open(f, "rb") as handle:
                    while block := handle.read(_BLOCK):
                        h.update(block)
                out[f.relative_to(step_dir).as_posix()] = h.hexdigest()
    return out


def write_digest(step_dir: pathlib.Path) -> None:
    """Write ``step_dir/DIGEST`` (through a temporary file and a rename: never half written)."""
    tmp = step_dir / (DIGEST + ".tmp")
    tmp.write_text(json.dumps(_file_digests(step_dir), indent=0, sort_keys=True))
    os.replace(tmp, step_dir / DIGEST)


def check_digest(step_dir: pathlib.Path) -> bool:
    """Whether ``step_dir``'s files match its digest: True if they do, False if it has no digest.

    Raises:
      CheckpointError: a file changed, is missing or was added, or the digest itself is unreadable.
    """
    path = step_dir / DIGEST
    if not path.exists():
        return False
    try:
        expected = json.loads(path.read_text())
        if not isinstance(expected, dict):
            raise ValueError("not a JSON object")
    except (ValueError, OSError) as e:
        raise CheckpointError(f"checkpoint {step_dir}: its digest {path} is unreadable ({e})") from e
    found = _file_digests(step_dir)
    bad = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
    if bad:
        what = [f"{k} ({'missing' if k not in found else 'not in the digest' if k not in expected else 'changed'})"
                for k in bad[:4]]
        raise CheckpointError(f"checkpoint {step_dir} is corrupt: {len(bad)} file(s) differ from its digest "
                              f"{DIGEST}: {', '.join(what)}{' ...' if len(bad) > 4 else ''}")
    return True


def set_aside(directory: str | pathlib.Path, steps: list[int]) -> list[pathlib.Path]:
    """Rename the folders of ``steps`` in ``directory`` to ``<step>.corrupt`` (``.corrupt-2``, ... if taken);
    returns the new paths. Nothing is deleted; orbax ignores these names."""
    directory, moved = pathlib.Path(directory), []
    for step in steps:
        target, n = directory / f"{step}.corrupt", 1
        while target.exists():
            n += 1
            target = directory / f"{step}.corrupt-{n}"
        os.replace(directory / str(step), target)
        moved.append(target)
    return moved


def complete_steps(directory: str | pathlib.Path) -> list[int]:
    """The steps with a complete checkpoint in ``directory``, as a fresh reader (a resumed run) sees them."""
    return sorted(ocp.path.step.checkpoint_steps(pathlib.Path(directory).absolute()))  # finalized, no tmp dirs


class Checkpointer:
    """Saves to and restores from ``directory`` (``WORKDIR/checkpoints``)."""

    def __init__(self, directory: str | pathlib.Path, keep: int = 3, *, read_only: bool = False,
                 on_saved: Callable[[float], None] | None = None):
        """``on_saved(seconds)``: called (from orbax's thread) once each save's files and digest are written, with
        the seconds since ``save`` began (the launcher sizes its grace period on it)."""
        self.directory = pathlib.Path(directory).absolute()
        self.on_saved = on_saved
        # The digest goes into the step's temporary folder once every file is written, before orbax renames it.
        async_options = None if read_only else ocp.AsyncOptions(post_finalization_callback=self._finalize)
        options = ocp.CheckpointManagerOptions(max_to_keep=None if read_only else keep, create=not read_only,
                                               read_only=read_only, save_interval_steps=0 if read_only else 1,
                                               async_options=async_options)
        with _quiet(read_only):  # orbax warns that a read-only manager's directory is read only
            self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)
        self._pending: int | None = None  # the step of a save not yet waited for
        self._writing: int | None = None  # the step of the last save started (the digest callback's)
        self._started = 0.0  # time.monotonic() when that save began
        self.damaged: list[int] = []  # steps newer than the one restore() returned that failed their check

    def _finalize(self) -> None:
        if self._writing is None:
            return
        if jax.process_index() == 0:
            found = [p for p in self.directory.glob(f"{self._writing}.orbax-checkpoint-tmp*") if p.is_dir()]
            for step_dir in found or [self.directory / str(self._writing)]:
                write_digest(step_dir)
        if self.on_saved is not None:
            self.on_saved(time.monotonic() - self._started)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, state, meta: dict[str, Any]) -> None:
        """Save ``state`` at its step (asynchronously; ``wait`` blocks until it is on disk).

        Raises:
          CheckpointWriteError: the previous save or this one failed; no further save should be attempted.
        """
        self.wait()
        step = int(jax.device_get(state.step))
        self._writing, self._started = step, time.monotonic()
        try:
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_saved_part(state)),
                                                            meta=ocp.args.JsonSave(meta)))
        except Exception as e:  # orbax raises OSError, ValueError, ... for a write it cannot start
            raise self._save_failed(step, e) from e
        self._pending = step

    def wait(self) -> None:
        """Block until the last save is on disk; ``CheckpointWriteError`` if writing it failed."""
        step, self._pending = self._pending, None
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # the background write's own error (OSError for a full disk, ...)
            raise self._save_failed(step, e) from e

    def _save_failed(self, step: int | None, error: Exception) -> CheckpointWriteError:
        kept = complete_steps(self.directory)
        where = f"step {step}" if step is not None else "a step"
        left = (f"the complete checkpoints there, steps {kept} (latest {kept[-1]}), are intact: fix the cause "
                "(free disk space, write permission) and rerun the same command with --config.resume=True to "
                f"continue from step {kept[-1]}" if kept else
                "no complete checkpoint is there: fix the cause (free disk space, write permission) and rerun the "
                "same command (without --config.resume=True)")
        return CheckpointWriteError(f"saving the checkpoint of {where} to {self.directory} failed: "
                               f"{type(error).__name__}: {error}. Training stopped; {left}.")

    def restore(self, state_template, step: int | None = None):
        """``(state, meta)`` from ``step`` (default: the latest that checks out), shaped and sharded like
        ``state_template``.

        With ``step`` None, a latest step that fails its digest or cannot be read is skipped with a warning for the
        one before it (those skipped are left in ``self.damaged``, newest first, for :func:`set_aside`).

        Raises:
          CheckpointError: no checkpoint, or none (``step``: that one) passes its digest and restores.
        """
        steps = [step] if step is not None else sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            raise CheckpointError(f"no checkpoint found in {self.directory}; start without resume=True "
                                  "or point --workdir at the run to continue")
        self.damaged, errors = [], []
        for s in steps:
            try:
                result = self._restore_step(state_template, s)
            except CheckpointError as e:
                if len(steps) == 1:
                    raise
                errors.append(str(e))
                if s != steps[-1]:
                    warnings.warn(f"{e}; trying the checkpoint before it", RuntimeWarning, stacklevel=2)
                    self.damaged.append(s)
                continue
            if self.damaged:
                warnings.warn(f"resuming from checkpoint {self.directory / str(s)}: the newer step(s) {self.damaged} "
                              "failed their checks", RuntimeWarning, stacklevel=2)
            return result
        self.damaged = []
        raise CheckpointError(f"none of the {len(steps)} checkpoints in {self.directory} passes its checks: "
                              + " | ".join(errors))

    def _restore_step(self, state_template, step: int):
        step_dir = self.directory / str(step)
        if not check_digest(step_dir):
            logging.getLogger(__name__).info("checkpoint %s has no %s (written before digests were kept): "
                                             "restored unverified", step_dir, DIGEST)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _saved_part(state_template))
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        except Exception as e:  # orbax raises many types for unreadable data
            raise CheckpointError(
                f"checkpoint {step_dir} could not be restored (corrupt, incomplete, or from a "
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
        check_digest(self.directory / str(step))
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
