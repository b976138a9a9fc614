"""The training program: runs, exact resume after a kill, configs, and errors that name the problem."""
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from snnjax.train import base_config, train_and_evaluate, validate

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_config(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def train_cmd(workdir, *overrides):
    return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "digits.py"),
            "--workdir", str(workdir), *overrides]


def run_train(workdir, *overrides, timeout=300):
    return subprocess.run(train_cmd(workdir, *overrides), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def final_state(workdir) -> dict:
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    restored = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(steps[-1]) / "state")
    return {"/".join(map(str, k)): np.asarray(v) for k, v in _flatten(restored)}


def _flatten(tree, prefix=()):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, prefix + (k,))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _flatten(v, prefix + (i,))
    else:
        yield prefix, tree


def tree_hash(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_digits_run_writes_metrics_summary_and_checkpoints(tmp_path):
    c = load_config("digits")
    c.num_steps, c.log_every_steps, c.checkpoint_every_steps, c.eval_every_steps = 30, 10, 10, 15
    c.global_batch_size = 32  # divides over the 8 test devices: data-parallel
    summary = train_and_evaluate(c, tmp_path)
    assert summary["mesh"]["data"] == 8 and summary["steps"] == 30
    for key in ("train_loss", "eval_accuracy", "steps", "global_batch_size", "samples_per_sec", "compile_seconds",
                "mode", "mesh"):
        assert summary[key] is not None, key
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train_loss" in r] == [10, 20, 30]
    assert [r["step"] for r in records if "eval_accuracy" in r] == [15, 30]
    assert summary["eval_accuracy"] > 0.3  # 30 steps already learn something (chance: 0.1)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [10, 20, 30]


def test_killed_run_resumes_bitwise_equal(tmp_path):
    overrides = ["--config.num_steps=400", "--config.checkpoint_every_steps=25", "--config.log_every_steps=50",
                 "--config.parallel.mode=none", "--config.data.encoder=poisson"]
    full = tmp_path / "full"
    assert run_train(full, *overrides).returncode == 0

    part = tmp_path / "part"
    proc = subprocess.Popen(train_cmd(part, *overrides), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if (part / "checkpoints").exists() and any(p.name.isdigit() for p in (part / "checkpoints").iterdir()):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (part / "summary.json").exists()

    resumed = run_train(part, *overrides, "--config.resume=True")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = final_state(full), final_state(part)
    assert a.keys() == b.keys() and len(a) > 3
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (full, part))
    assert sa["eval_accuracy"] == sb["eval_accuracy"] and sa["steps"] == sb["steps"] == 400


@pytest.mark.parametrize("name,model_overrides", [
    ("cifar10dvs_vgg", {"widths": (4, 4, 8, 8, 8, 8, 8, 8)}),
    ("spikformer_ti", {"embed_dims": 16, "num_heads": 2, "depths": 1}),
])
def test_model_configs_run_on_synthetic_events(tmp_path, name, model_overrides):
    c = load_config(name)
    for k, v in model_overrides.items():
        c.model[k] = v
    c.data.name, c.data.data_dir, c.data.time_steps = "synthetic_dvs", None, 2
    c.data.options = {"num_examples": 16, "size": 32}
    c.global_batch_size, c.num_steps, c.log_every_steps, c.checkpoint_every_steps = 8, 2, 1, 2
    c.grad_accum_steps, c.warmup_steps = 2, 0
    c.parallel.mode = "none"
    summary = train_and_evaluate(c, tmp_path)
    assert summary["steps"] == 2 and np.isfinite(summary["train_loss"])
    assert 0.0 <= summary["eval_accuracy"] <= 1.0


def test_float64_and_tet_loss(tmp_path, x64):
    c = load_config("digits")
    c.dtype, c.loss, c.tet_lambda, c.num_steps, c.parallel.mode = "float64", "tet", 0.1, 3, "none"
    summary = train_and_evaluate(c, tmp_path)
    assert summary["dtype"] == "float64" and np.isfinite(summary["train_loss"])


@pytest.mark.parametrize("override,message", [
    ("--config.optimizer=adamx", "config.optimizer='adamx' is not allowed; choose one of"),
    ("--config.model.width=3", 'names no key of the config ("width")'),
    ("--config.parallel.mesh=data=3", "needs 3 devices but 8 are available"),
    ("--config.global_batch_size=12", "does not divide over data x fsdp = 8"),
    ("--config.data.name=imagenet", "config.data.name='imagenet' is not allowed"),
])
def test_bad_config_fails_fast_naming_the_key(tmp_path, override, message):
    result = run_train(tmp_path / "run", override)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-1500:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_unknown_override_key_is_rejected(tmp_path):
    result = run_train(tmp_path, "--config.learnng_rate=0.1")
    assert result.returncode == 2 and "learnng_rate" in result.stderr and "Traceback" not in result.stderr


def test_every_model_option_can_be_overridden(tmp_path):
    result = run_train(tmp_path, "--config.model.neuron=PLIF", "--config.model.surrogate_function=atan",
                       "--config.num_steps=3", "--config.parallel.mode=none")
    assert result.returncode == 0, result.stderr[-1500:]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model"]["neuron"] == "PLIF" and config["model"]["surrogate_function"] == "atan"


def test_model_config_validation_names_allowed_options():
    from snnjax.models.registry import create_model

    with pytest.raises(ValueError, match=r"has no option\(s\) \['width'\]; allowed:"):
        create_model("mlp", {"width": 3}, rngs=None)


def test_missing_data_directory(tmp_path):
    result = run_train(tmp_path / "run", "--config.data.name=nmnist", f"--config.data.data_dir={tmp_path}/nowhere")
    assert result.returncode == 1
    assert "nowhere" in result.stderr and "error:" in result.stderr


def test_corrupt_checkpoint_is_reported_and_left_untouched(tmp_path):
    assert run_train(tmp_path, "--config.num_steps=20", "--config.checkpoint_every_steps=10",
                     "--config.parallel.mode=none").returncode == 0
    latest = tmp_path / "checkpoints" / "20"
    for f in (latest / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"not a checkpoint")
    before = tree_hash(tmp_path / "checkpoints")
    result = run_train(tmp_path, "--config.num_steps=30", "--config.parallel.mode=none", "--config.resume=True")
    assert result.returncode == 1
    assert "could not be restored" in result.stderr and "20" in result.stderr
    assert tree_hash(tmp_path / "checkpoints") == before


def test_resume_without_checkpoint_and_fresh_run_over_checkpoints(tmp_path):
    result = run_train(tmp_path, "--config.resume=True", "--config.parallel.mode=none")
    assert result.returncode == 1 and "holds no checkpoint" in result.stderr
    assert run_train(tmp_path, "--config.num_steps=5", "--config.parallel.mode=none").returncode == 0
    before = tree_hash(tmp_path / "checkpoints")
    result = run_train(tmp_path, "--config.num_steps=5", "--config.parallel.mode=none")
    assert result.returncode == 1 and "already holds checkpoints" in result.stderr
    assert tree_hash(tmp_path / "checkpoints") == before


def test_validate_rejects_bad_values():
    c = base_config()
    c.grad_accum_steps = 3
    with pytest.raises(ValueError, match="must divide by config.grad_accum_steps"):
        validate(c)
    c = base_config()
    c.learning_rate = -1.0
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        validate(c)
