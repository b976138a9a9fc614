"""Faults a long run meets: a preemption signal, a NaN/inf step, a checkpoint that cannot be written.

Every run is the digits MLP for a few steps on one device (a pipeline where said), in-process; ``reference``
is the uninterrupted run the interrupted ones must reproduce bitwise. SIGTERM stops a train.py process, whose
workdir resumes in-process to equal an uninterrupted run of its own.
"""
import errno
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import struct
from helpers import ROOT, load_config, start_until_checkpoint
from orbax.checkpoint._src.handlers.json_checkpoint_handler import JsonCheckpointHandler

from snnjax.data import Loader
from snnjax.train import base_config, loop, train_and_evaluate, validate
from snnjax.train.checkpoint import Checkpointer, CheckpointError, CheckpointWriteError, check_digest, complete_steps
from snnjax.train.loop import NonFiniteError, Preempted

STEPS = 6
NAN_STEP = 3  # 1-based, as the logs count


def digits_config(**overrides):
    """``configs/digits.py`` on one device (``parallel.mode=none``), with ``overrides``."""
    c = load_config("digits", **overrides)
    c.parallel.mode = "none"
    return c


def small_config(**overrides):
    return digits_config(**{"num_steps": STEPS, "global_batch_size": 32, "log_every_steps": 2,
                            "checkpoint_every_steps": 1, "keep_checkpoints": STEPS + 1, **overrides})  # every step


def saved(workdir: pathlib.Path, step: int) -> dict[str, np.ndarray]:
    """Every array of checkpoint ``step`` (step, params, model_state, opt_state), by path."""
    tree = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(step) / "state")
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}/{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{prefix}/{i}")
        else:
            out[prefix] = np.asarray(node)

    walk(tree, "")
    return out


def assert_same(a: dict, b: dict, *, but=("/step",)):
    assert a.keys() == b.keys() and any(k.startswith("/params") for k in a)
    for k in a:
        if k not in but:
            assert np.array_equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reference")
    train_and_evaluate(small_config(), workdir)
    return workdir


def inject_nan(monkeypatch, step: int = NAN_STEP) -> int:
    """Make the training batch of ``step`` (1-based) hold a NaN example; returns that example's index."""
    real = loop.make_sources
    box = {}

    def make_sources(c):
        train, test = real(c)
        loader = Loader(train, c.global_batch_size, seed=c.seed, process_index=0, process_count=1, prefetch=0)
        box["index"] = int(loader.step_indices(0, step - 1)[0][5])
        train._inputs[box["index"], 2, 3, 0] = np.nan
        return train, test

    monkeypatch.setattr(loop, "make_sources", make_sources)
    make_sources(small_config())
    return box["index"]


@pytest.fixture(scope="module")
def skipped_run(tmp_path_factory):
    """A run with ``nonfinite="skip"`` whose step ``NAN_STEP`` has a NaN input: ``(workdir, summary)``."""
    workdir = tmp_path_factory.mktemp("skip")
    with pytest.MonkeyPatch.context() as monkeypatch:
        inject_nan(monkeypatch)
        summary = train_and_evaluate(small_config(nonfinite="skip"), workdir)
    return workdir, summary


# ----------------------------------------------------------------------------- signals

def pipelined(c):
    """``c`` under a 1F1B pipeline over stage=2 x data=4 (the MLP's units split over the two stages)."""
    c.parallel.mode, c.parallel.mesh = "pp", "stage=2,data=4"
    return c


@pytest.fixture(scope="module")
def pp_reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pp_reference")
    train_and_evaluate(pipelined(small_config()), workdir)
    return workdir


@pytest.mark.parametrize("layout", ["none", "pp"])
def test_sigint_saves_the_step_then_resume_is_bitwise_equal(tmp_path, monkeypatch, request, layout):
    reference = request.getfixturevalue("reference" if layout == "none" else "pp_reference")
    real = loop.make_sources

    def make_sources(c):  # the third batch read sends SIGINT (from the prefetch thread)
        train, test = real(c)
        read, reads = train._read, []

        def reading(indices):
            reads.append(1)
            if len(reads) == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return read(indices)

        train._read = reading
        return train, test

    monkeypatch.setattr(loop, "make_sources", make_sources)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    c = small_config(checkpoint_every_steps=100)  # the only checkpoint is the one the signal asks for
    if layout == "pp":
        c = pipelined(c)
    with pytest.raises(Preempted) as stopped:
        train_and_evaluate(c, tmp_path)
    k = stopped.value.step
    assert stopped.value.signum == signal.SIGINT and stopped.value.exit_code == 130 and 1 <= k < STEPS
    assert f"stopped by SIGINT after step {k} of {STEPS}" in str(stopped.value)
    assert "--config.resume=True" in str(stopped.value)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert complete_steps(tmp_path / "checkpoints") == [k] and not (tmp_path / "summary.json").exists()
    assert_same(saved(tmp_path, k), saved(reference, k), but=())

    monkeypatch.undo()
    c.resume = True
    summary = train_and_evaluate(c, tmp_path)
    assert summary["steps"] == STEPS
    assert_same(saved(tmp_path, STEPS), saved(reference, STEPS), but=())


SIGTERM_RUN = {"num_steps": 300, "checkpoint_every_steps": 100, "log_every_steps": 50, "eval_every_steps": 1000}


def test_sigterm_stops_train_py_with_143_then_resume_is_bitwise_equal(tmp_path, capsys):
    """train.py on SIGTERM: exit code 143 and where its checkpoint is; that workdir resumed (here, in-process: the
    same ``train_and_evaluate``) ends bitwise equal to an uninterrupted run."""
    part = tmp_path / "part"
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "digits.py"), "--workdir",
           str(part), "--config.parallel.mode=none", *(f"--config.{k}={v}" for k, v in SIGTERM_RUN.items())]
    proc = start_until_checkpoint(cmd, part, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    stop = re.search(r"stopped by SIGTERM after step (\d+) of 300: checkpoint (\S+) is on disk; .*"
                     r"--config.resume=True", out)
    assert stop, out[-2000:]
    k = int(stop.group(1))
    assert pathlib.Path(stop.group(2)) == part / "checkpoints" / str(k)
    assert max(complete_steps(part / "checkpoints")) == k
    assert not (part / "summary.json").exists()

    c = digits_config(**SIGTERM_RUN)  # the run above
    capsys.readouterr()
    train_and_evaluate(c, tmp_path / "full")
    c.resume = True
    train_and_evaluate(c, part)
    assert f"resuming at step {k}" in capsys.readouterr().out
    assert_same(saved(part, 300), saved(tmp_path / "full", 300), but=())


# ----------------------------------------------------------------------------- non-finite steps

def test_nonfinite_must_be_stop_or_skip():
    c = base_config()
    assert c.nonfinite == "stop"
    c.nonfinite = "ignore"
    with pytest.raises(ValueError, match=r"config.nonfinite='ignore' is not allowed; choose one of \['stop', 'skip'\]"):
        validate(c)


def test_skip_keeps_the_state_of_a_nonfinite_step_and_counts_it(skipped_run, reference):
    workdir, summary = skipped_run
    assert summary["skipped_steps"] == 1
    before, at, after = (saved(workdir, s) for s in (NAN_STEP - 1, NAN_STEP, NAN_STEP + 1))
    assert_same(before, saved(reference, NAN_STEP - 1), but=())  # the same trajectory up to the NaN
    assert_same(at, before)  # params, optimizer state and BatchNorm statistics as before the step
    assert at["/step"] == NAN_STEP  # ... but the step counter moved on, so the data order is kept
    assert any(not np.array_equal(at[k], after[k]) for k in at if k.startswith("/params"))
    assert all(np.isfinite(v).all() for v in saved(workdir, STEPS).values())
    assert np.isfinite(summary["train_loss"])
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"]: r["skipped_steps"] for r in records if "skipped_steps" in r} == {2: 0, 4: 1, 6: 0}


def test_stop_names_the_step_saves_nothing_after_it_and_resume_with_skip_continues(tmp_path, monkeypatch,
                                                                                  skipped_run):
    index = inject_nan(monkeypatch)
    c = small_config(checkpoint_every_steps=2, log_every_steps=4)  # the NaN step (3) is first read at step 4
    with pytest.raises(NonFiniteError) as stopped:
        train_and_evaluate(c, tmp_path)
    message = str(stopped.value)
    # The spikes of a NaN membrane are 0, so the loss can stay finite; the surrogate gradient cannot.
    assert re.match(rf"step {NAN_STEP}: the loss \(\S+\) or the gradient norm \(nan\) is not finite\. ", message)
    assert f"holds NaN/inf inputs (the usual cause): digits training example(s) {index}." in message
    assert f"are steps [{NAN_STEP - 1}]" in message and "--config.resume=True" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [str(NAN_STEP - 1)]
    assert all(np.isfinite(v).all() for v in saved(tmp_path, NAN_STEP - 1).values())

    # The kept checkpoint continues, skipping the bad step, exactly as a run that skipped it from the start.
    c.resume, c.nonfinite = True, "skip"
    assert train_and_evaluate(c, tmp_path)["skipped_steps"] == 1
    assert_same(saved(tmp_path, STEPS), saved(skipped_run[0], STEPS), but=())


def test_a_corrupt_example_is_skipped_and_counted(tmp_path, monkeypatch):
    """data.on_corrupt="skip": an example whose read fails (as a corrupt file's does: ValueError naming it) is
    replaced by the next one, with a warning; metrics.jsonl and summary.json count it."""
    real = loop.make_sources

    def make_sources(c):
        train, test = real(c)
        read = train._read
        bad = Loader(train, c.global_batch_size, seed=c.seed, prefetch=0).step_indices(0, 1)[0][3]  # step 2's

        def reading(indices):
            if bad in indices:
                raise ValueError(f"digits/{bad}.png: corrupt")
            return read(indices)

        train._read = reading
        return train, test

    monkeypatch.setattr(loop, "make_sources", make_sources)
    c = small_config(checkpoint_every_steps=100, log_every_steps=3)
    c.data.on_corrupt = "skip"
    with pytest.warns(RuntimeWarning, match=r"skipping a corrupt digits training example \(config.data.on_corrupt="
                                            r"'skip'\): digits/\d+.png: corrupt"):
        summary = train_and_evaluate(c, tmp_path)
    assert summary["skipped_examples"] == {"train": 1, "test": 0}
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_examples"] for r in records if "train_loss" in r] == [1, 1]


def test_a_diverged_step_is_told_apart_from_bad_inputs(tmp_path):
    c = small_config(learning_rate=1e38, optimizer="sgd", schedule="constant", checkpoint_every_steps=100)
    with pytest.raises(NonFiniteError, match=r"Its batch inputs are finite, so the model diverged: lower "
                                             r"config.learning_rate"):
        train_and_evaluate(c, tmp_path)
    assert complete_steps(tmp_path / "checkpoints") == []


# ----------------------------------------------------------------------------- checkpoint writes

@pytest.mark.parametrize("where", ["background write", "start of the save"])
def test_failed_checkpoint_write_keeps_earlier_checkpoints(tmp_path, monkeypatch, reference, where):
    """Saves at steps 2, 4, 6; writing step 4 fails (disk full) and the run stops at once with step 2 intact."""
    if where == "background write":
        real, calls = JsonCheckpointHandler._save_fn, []

        async def save_fn(self, item, directory):
            calls.append(directory)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(directory))
            await real(self, item, directory)

        monkeypatch.setattr(JsonCheckpointHandler, "_save_fn", save_fn)
    else:
        real, calls = ocp.CheckpointManager.save, []

        def save(self, step, *args, **kwargs):
            calls.append(step)
            if step == 4:
                raise OSError(errno.ENOSPC, "No space left on device", str(self.directory))
            return real(self, step, *args, **kwargs)

        monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    c = small_config(checkpoint_every_steps=2, keep_checkpoints=1)  # a finished save of 4 would delete 2
    with pytest.raises(CheckpointWriteError, match=r"saving the checkpoint of step 4 to \S+ failed: OSError: \[Errno "
                                                   r"28\] No space left on device.*steps \[2\] \(latest 2\), are "
                                                   r"intact.*--config.resume=True to continue from step 2") as failed:
        train_and_evaluate(c, tmp_path)
    assert failed.value.exit_code == 75  # train.py's: resumable, as after a preemption
    assert len(calls) == 2  # nothing was saved after the failure
    assert complete_steps(tmp_path / "checkpoints") == [2] and not (tmp_path / "summary.json").exists()

    monkeypatch.undo()
    c.resume = True
    assert train_and_evaluate(c, tmp_path)["steps"] == STEPS
    assert_same(saved(tmp_path, STEPS), saved(reference, STEPS), but=())


def test_a_failed_first_checkpoint_leaves_a_workdir_a_fresh_run_can_use(tmp_path, monkeypatch, reference):
    real = JsonCheckpointHandler._save_fn

    async def save_fn(self, item, directory):
        raise OSError(errno.EACCES, "Permission denied", str(directory))

    monkeypatch.setattr(JsonCheckpointHandler, "_save_fn", save_fn)
    c = small_config(checkpoint_every_steps=2)
    with pytest.raises(CheckpointError, match=r"saving the checkpoint of step 2 .* PermissionError: .*no complete "
                                              r"checkpoint is there: .* rerun the same command \(without "):
        train_and_evaluate(c, tmp_path)
    assert complete_steps(tmp_path / "checkpoints") == [] and any((tmp_path / "checkpoints").iterdir())

    monkeypatch.setattr(JsonCheckpointHandler, "_save_fn", real)
    train_and_evaluate(c, tmp_path)
    assert_same(saved(tmp_path, STEPS), saved(reference, STEPS), but=())


@struct.dataclass
class State:
    """The fields of a train state that a checkpoint holds."""

    step: object
    params: dict
    model_state: dict
    opt_state: dict


def test_each_save_reports_how_long_it_took(tmp_path):
    """``on_saved`` gets each save's seconds once its files and digest are written (the launcher's grace period)."""
    took = []
    c = Checkpointer(tmp_path, on_saved=took.append)
    for step in (1, 2):
        c.save(State(jnp.int32(step), {"w": jnp.zeros(8)}, {}, {}), {"step": step})
    c.close()
    assert len(took) == 2 and all(0 < t < 120 for t in took) and check_digest(tmp_path / "2")


# ----------------------------------------------------------------------------- SIGKILL during checkpoint writes

# Saves step 1, 2, ... (keep 2) of a state whose every array is a function of the step, printing each step once
# its save started, until killed.
SAVER = """
import sys
import jax, jax.numpy as jnp
from flax import struct
from snnjax.train.checkpoint import Checkpointer

@struct.dataclass
class State:
    step: jax.Array
    params: dict
    model_state: dict
    opt_state: dict

def state(step):
    return State(jnp.int32(step), {"w": jnp.arange(4096.0) * step, "b": jnp.full(3, step + 0.5)}, {},
                 {"mu": jnp.arange(4096.0) + 4096 * step})  # exact in float32

c = Checkpointer(sys.argv[1], keep=2)
step = 0
while True:
    step += 1
    c.save(state(step), {"step": step})
    print(step, flush=True)
"""
KILL_TRIALS = int(os.environ.get("SNNJAX_KILL_TRIALS", "1"))


def test_sigkill_during_checkpoint_writes_leaves_the_latest_complete_step_restorable(tmp_path):
    """Killed at random moments of a stream of saves (array files, metadata, the digest, the rename, the deletion
    of old steps): every complete step passes its digest and the latest restores to exactly what was saved.
    ``SNNJAX_KILL_TRIALS=50`` for the by-hand run."""
    template = State(jnp.int32(0), {"w": jnp.zeros(4096), "b": jnp.zeros(3)}, {}, {"mu": jnp.zeros(4096)})
    rng = np.random.default_rng(0)
    for trial in range(KILL_TRIALS):
        directory = tmp_path / str(trial)
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(directory)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)})
        wanted = int(rng.integers(2, 6))  # past the first saves, then a random moment within a save
        while int(proc.stdout.readline() or wanted) < wanted:
            pass
        time.sleep(rng.uniform(0, 0.05))  # (the pipe holds thousands of lines: the child does not block on it)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        steps = complete_steps(directory)
        assert steps, f"trial {trial}: no complete checkpoint after step {wanted}"
        # The latest passes its digest; an older one may have lost files (the digest first) to a kill while keep=2
        # deleted it, and restores only if every newer one fails (then unverified, as a step from before digests).
        assert check_digest(directory / str(steps[-1])) and all(check_digest(directory / str(s)) in (True, False)
                                                                 for s in steps)
        reader = Checkpointer(directory, read_only=True)
        restored, meta = reader.restore(template)
        reader.close()
        s = steps[-1]
        assert meta == {"step": s} and int(restored.step) == s and not reader.damaged
        np.testing.assert_array_equal(restored.params["w"], np.arange(4096.0) * s)
        np.testing.assert_array_equal(restored.params["b"], np.full(3, s + 0.5))
        np.testing.assert_array_equal(restored.opt_state["mu"], np.arange(4096.0) + 4096 * s)
