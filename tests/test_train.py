"""The training program: runs, exact resume after a kill, configs, and errors that name the problem."""
import ast
import contextlib
import functools
import hashlib
import importlib.util
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import quick_compiles
from flax import nnx
from helpers import ROOT, load_config, start_until_checkpoint

from snnjax.models import create_model
from snnjax.models.registry import REGISTRY, DataShape, model_config, sizes_from_data
from snnjax.parallel.pipeline_plan import choose_microbatches
from snnjax.runtime import hostmem
from snnjax.train import base_config, train_and_evaluate, validate
from snnjax.train import config as config_lib
from snnjax.train.checkpoint import CheckpointError
from snnjax.train.config import source_kwargs
from snnjax.train.step import StepConfig, TrainState, classification_loss, eval_step, split_model, train_step


def train_cmd(workdir, *overrides, config="digits"):
    return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / f"{config}.py"),
            "--workdir", str(workdir), *overrides]


def run_train(workdir, *overrides, timeout=300, config="digits"):
    return subprocess.run(train_cmd(workdir, *overrides, config=config), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


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


def test_pipeline_run_trains_and_checkpoints(tmp_path):
    """mode=pp over stage=2 x data=4 (the MLP's 2 units, one per stage) trains, evaluates and checkpoints."""
    c = load_config("digits")
    c.num_steps, c.log_every_steps, c.checkpoint_every_steps, c.global_batch_size = 20, 10, 10, 32
    c.parallel.mode, c.parallel.mesh, c.parallel.pp.schedule = "pp", "stage=2,data=4", "zero_bubble"
    summary = train_and_evaluate(c, tmp_path)
    assert summary["mode"] == "pp" and summary["mesh"]["stage"] == 2 and summary["steps"] == 20
    assert summary["eval_accuracy"] > 0.2  # chance: 0.1
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [10, 20]


def digits_run(**overrides):
    """``configs/digits.py`` with ``overrides`` (dotted keys) as ``--config.KEY=VALUE`` flags: the config, the flags."""
    flags = [f"--config.{k}={v}" for k, v in overrides.items()]
    return load_config("digits", *flags), flags


def test_killed_run_resumes_bitwise_equal(tmp_path):
    """train.py SIGKILLed after its first checkpoint; that workdir resumed (here, in-process: the same
    ``train_and_evaluate``) ends bitwise equal to an uninterrupted run, Poisson spikes included."""
    c, flags = digits_run(**{"num_steps": 300, "checkpoint_every_steps": 100, "log_every_steps": 50,
                             "eval_every_steps": 1000, "parallel.mode": "none", "data.encoder": "poisson"})
    part = tmp_path / "part"
    proc = start_until_checkpoint(train_cmd(part, *flags), part, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (part / "summary.json").exists()

    full = tmp_path / "full"
    train_and_evaluate(c, full)
    c.resume = True
    train_and_evaluate(c, part)
    a, b = final_state(full), final_state(part)
    assert a.keys() == b.keys() and len(a) > 3
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (full, part))
    assert sa["eval_accuracy"] == sb["eval_accuracy"] and sa["steps"] == sb["steps"] == 300


CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))
# Flags that shrink each model for a smoke run; sizes the data gives (for 16x16x2 frames, 10 classes, T=2).
_RESNET = ["--config.model.widths=(4,4,8,8)", "--config.model.stage_blocks=(1,1,1,1)"]
SHRINK = {"mlp": [], "cifar10dvs_vgg": ["--config.model.widths=(4,4,8,8,8,8,8,8)"],
          "spikformer": ["--config.model.embed_dims=16", "--config.model.num_heads=2", "--config.model.depths=1"],
          "spiking_resnet18": _RESNET, "sew_resnet18": _RESNET,
          "dvsgesture_net": ["--config.model.stages=2", "--config.model.channels=4",
                             "--config.model.hidden_features=8"],
          "sdt": ["--config.model.embed_dims=16", "--config.model.num_heads=2", "--config.model.depths=1"],
          "qkformer": ["--config.model.embed_dims=16", "--config.model.num_heads=(2,2,2)",
                       "--config.model.depths=(1,0,1)"],  # both block kinds (Q-K attention, self-attention)
          "ms_resnet18": ["--config.model.base_channels=4", "--config.model.layers=(1,1,1)"],
          "spiking_vgg11_bn": ["--config.model.cfg=(4,'M',8,'M',8,'M',8,'M')", "--config.model.hidden_features=8"]}
_TRANSFORMER_16x16 = {"in_channels": 2, "num_classes": 10, "T": 2}
SIZES_16x16 = {"mlp": {"in_features": 16 * 16 * 2, "num_classes": 10},
               "cifar10dvs_vgg": {"in_channels": 2, "image_size": 16, "num_classes": 10},
               "spikformer": {"in_channels": 2, "img_size_h": 16, "img_size_w": 16, "num_classes": 10, "T": 2},
               "spiking_resnet18": {"in_channels": 2, "num_classes": 10}, "sew_resnet18": {"in_channels": 2,
                                                                                          "num_classes": 10},
               "dvsgesture_net": {"in_channels": 2, "image_size": 16, "num_classes": 10},
               "sdt": _TRANSFORMER_16x16, "qkformer": _TRANSFORMER_16x16, "ms_resnet18": _TRANSFORMER_16x16,
               "spiking_vgg11_bn": {"in_channels": 2, "num_classes": 10}}


def num_params(model_name: str, model_options: dict) -> int:
    """Parameters of the model these options build (its constructor traced abstractly: nothing compiles)."""
    model = nnx.eval_shape(lambda: create_model(model_name, model_options, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@functools.cache
def _train_py():
    """train.py as a module, loaded once per process."""
    spec = importlib.util.spec_from_file_location("train_py", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_in_process(workdir, *overrides, config="digits") -> subprocess.CompletedProcess:
    """What ``run_train`` runs, without starting a process: train.py's own flag parsing and ``main`` in this
    process (no interpreter start, this process's compiled programs reused). Returns the exit status, stdout and
    stderr the command would have. train.py's tuning of glibc's allocator (``hostmem``), which would keep this
    process's freed memory for good, is left out."""
    argv = train_cmd(workdir, *overrides, config=config)[1:]  # [train.py, --config, ...]
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(hostmem, "keep_freed_memory", lambda: False), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            status = _train_py().main(argv[1:])
        except SystemExit as e:  # a bad flag: exit status 2
            status = e.code
    return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())


# One config per model family trains through train.py (its flag parsing and main, in this process; its programs
# compiled with conftest's quick_compiles: the runs check what train.py does, not XLA's optimised code); the other
# configs of its family (same model code, another dataset or recipe) are built in this process, without
# compiling (the suite's time). They train on one device (parallel.mode=none: a third less CPU time than dp over
# the 8 devices); the families' layouts are checked by test_zoo_layouts, test_zoo_transformers_layouts, test_zoo_vgg
# and test_parallel_equivalence, train.py's batch split over data by the digits runs.
TRAINED = ("digits", "ncaltech101_vgg", "spikformer_ti", "imagenet_sew_resnet18", "dvsgesture_plif",
           "cifar10dvs_sdt", "imagenet_qkformer", "cifar10_ms_resnet18", "cifar10_spiking_vgg11_bn")
SMALL = ["--config.num_steps=2", "--config.eval_every_steps=2", "--config.global_batch_size=8",
         "--config.data.time_steps=2", "--config.data.options.num_examples=12", "--config.data.options.size=16",
         "--config.parallel.mode=none"]


def test_each_model_family_has_a_trained_config():
    assert {load_config(name).model.name for name in TRAINED} >= {load_config(name).model.name
                                                                 for name in CONFIGS} - {"spiking_resnet18"}
    assert set(TRAINED) <= set(CONFIGS)  # spiking_resnet18 is sew_resnet18's class with another cnf and neuron


@pytest.mark.parametrize("name", TRAINED)
def test_every_config_switches_to_synthetic_events_with_one_flag(tmp_path, name):
    """``--config.data.name=synthetic_dvs`` is enough: the config's data_dir is ignored with a note, sizes follow."""
    c = load_config(name)
    with quick_compiles():
        result = train_in_process(tmp_path, "--config.data.name=synthetic_dvs", *SMALL, *SHRINK[c.model.name],
                                  config=name)
    assert result.returncode == 0, result.stderr[-3000:]
    if c.data.data_dir is not None:
        assert f"note: synthetic_dvs reads no files; ignoring data.data_dir='{c.data.data_dir}'" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dataset"] == "synthetic_dvs" and summary["steps"] == 2
    # 12 test examples in batches of 8 (the second one padded): accuracy is a count of the 12.
    assert summary["eval_accuracy"] * 12 == pytest.approx(round(summary["eval_accuracy"] * 12), abs=1e-9)
    model = json.loads((tmp_path / "config.json").read_text())["model"]
    options = {k: v for k, v in model.items() if k != "name" and v is not None}
    assert summary["num_params"] == num_params(c.model.name, {**options, **SIZES_16x16[c.model.name]})


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in TRAINED])
def test_the_other_configs_validate_and_build_their_model_on_synthetic_events(name):
    """The same switch, in this process: the config validates, notes the ignored data_dir, and its (shrunk)
    model builds for the synthetic frames."""
    c = load_config(name)
    c.data.name = "synthetic_dvs"
    validate(c)
    _, notes = source_kwargs(c)
    if c.data.data_dir is not None:
        assert f"synthetic_dvs reads no files; ignoring data.data_dir='{c.data.data_dir}'" in notes
    shrink = {flag.split("=")[0].removeprefix("--config.model."): ast.literal_eval(flag.split("=", 1)[1])
              for flag in SHRINK[c.model.name]}
    options = {k: v for k, v in c.model.items() if k != "name" and v is not None}
    assert num_params(c.model.name, {**options, **shrink, **SIZES_16x16[c.model.name]}) > 0


def test_data_settings_of_another_dataset_are_ignored_with_notes():
    c = load_config("cifar10dvs_vgg")
    c.data.name = "synthetic_dvs"
    kwargs, notes = source_kwargs(c)
    assert kwargs == {"data_dir": None, "time_steps": 10, "size": 48}
    assert notes == ["synthetic_dvs reads no files; ignoring data.data_dir='data/cifar10dvs'"]
    c.data.name = "nmnist"
    kwargs, notes = source_kwargs(c)
    assert kwargs == {"data_dir": "data/cifar10dvs", "time_steps": 10}
    assert notes == ["nmnist takes no option(s) ['size']; ignoring data.options.size=48"]
    for unset in ("", "None"):
        c.data.data_dir = unset
        assert source_kwargs(c)[0]["data_dir"] is None
    c = load_config("mnist")
    c.data.name = "synthetic_dvs"
    assert source_kwargs(c)[1][-1] == ("synthetic_dvs gives event frames, which need no encoder; ignoring "
                                       "data.encoder='poisson'")


def test_an_unset_data_dir_reaches_a_dataset_that_needs_one(tmp_path):
    result = train_in_process(tmp_path, "--config.data.name=nmnist", "--config.data.data_dir=", config="cifar10dvs_vgg")
    assert result.returncode == 1 and "nmnist needs data_dir" in result.stderr, result.stderr[-1500:]


def test_data_a_model_cannot_take_is_named(tmp_path):
    c = load_config("cifar10dvs_vgg")
    c.data.name, c.data.data_dir = "digits", None
    with pytest.raises(ValueError, match=r"'cifar10dvs_vgg' pools its frames down by 16; the data gives 8x8"):
        train_and_evaluate(c, tmp_path)
    c.data.options.no_such_option = 1
    with pytest.raises(ValueError, match=r"config.data.options has no key\(s\) \['no_such_option'\]"):
        validate(c)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_model_registry_sizes_match_their_keys(name):
    sizes = sizes_from_data(name, DataShape(frame_shape=(32, 32, 2), num_classes=7, time_steps=3))
    assert set(sizes) == set(REGISTRY[name].size_keys) and sizes["num_classes"] == 7
    assert not set(sizes) & set(model_config(name))  # sizes are left to the data


def numpy_loss(logits: np.ndarray, labels: np.ndarray, kind: str, tet_lambda: float) -> np.ndarray:
    """Per-example loss of logits [T, N, K], written out from its definition (no optax)."""
    def cross_entropy(z, y):  # z [..., K], y [...]
        log_p = z - z.max(-1, keepdims=True)
        log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
        return -np.take_along_axis(log_p, y[..., None], -1)[..., 0]

    if kind == "ce":
        return cross_entropy(logits.mean(0), labels)
    per_step = cross_entropy(logits, np.broadcast_to(labels, logits.shape[:2])).mean(0)
    return (1 - tet_lambda) * per_step + tet_lambda * ((logits - 1.0) ** 2).mean(axis=(0, 2))


@pytest.mark.parametrize("kind,tet_lambda", [("ce", 0.0), ("tet", 0.0), ("tet", 0.3)])
def test_classification_loss_matches_its_formula(kind, tet_lambda, x64):
    rng = np.random.default_rng(0)
    logits, labels = 3.0 * rng.normal(size=(4, 6, 5)), rng.integers(0, 5, 6)
    got = classification_loss(jnp.asarray(logits), jnp.asarray(labels), kind, tet_lambda)
    np.testing.assert_allclose(np.asarray(got), numpy_loss(logits, labels, kind, tet_lambda), rtol=1e-12)


def test_train_and_eval_steps_report_the_models_loss_and_accuracy(x64):
    """The steps' loss, accuracy and counts equal numpy's on the model's own logits (TET, float64)."""
    model = create_model("mlp", {"in_features": 6, "hidden": (16,), "num_classes": 4}, rngs=nnx.Rngs(0),
                         dtype=jnp.float64, param_dtype=jnp.float64)
    graphdef, params, rngs, rest = split_model(model)
    tx = optax.sgd(0.1)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                       opt_state=tx.init(params))
    x = np.random.default_rng(1).uniform(0, 3, (3, 8, 6))  # [T, N, F]
    logits = np.asarray(nnx.merge(graphdef, params, rngs, rest)(jnp.asarray(x)))
    pred = logits.mean(0).argmax(-1)
    labels = np.where(np.arange(8) < 5, pred, (pred + 1) % 4)  # 5 of 8 right, by construction
    cfg = StepConfig(seed=0, time_steps=3, encoder=None, loss="tet", tet_lambda=0.25, compute_dtype=jnp.float64)
    batch = {"inputs": jnp.asarray(x), "labels": jnp.asarray(labels)}
    expected = numpy_loss(logits, labels, "tet", 0.25)

    _, metrics = jax.jit(lambda s, b: train_step(cfg, graphdef, tx, s, b))(state, batch)
    np.testing.assert_allclose(float(metrics["loss"]), expected.mean(), rtol=1e-12)
    assert float(metrics["accuracy"]) == 5 / 8

    mask = np.arange(8) < 6  # the last two examples are padding
    out = eval_step(cfg, graphdef, state, {**batch, "mask": jnp.asarray(mask)}, jnp.asarray(0))
    assert float(out["count"]) == 6 and float(out["correct"]) == 5
    np.testing.assert_allclose(float(out["loss"]), expected[mask].sum(), rtol=1e-12)


def test_float64_run_trains_float64_parameters(tmp_path, x64):
    c = load_config("digits")
    c.dtype, c.loss, c.tet_lambda, c.num_steps, c.parallel.mode = "float64", "tet", 0.1, 3, "none"
    summary = train_and_evaluate(c, tmp_path)
    assert summary["dtype"] == "float64" and summary["steps"] == 3
    params = {k: v for k, v in final_state(tmp_path).items() if k.startswith("params/")}
    assert params and {v.dtype for v in params.values()} == {np.dtype(np.float64)}, params.keys()


BAD_CONFIGS = [
    ("--config.optimizer=adamx", "config.optimizer='adamx' is not allowed; choose one of"),
    ("--config.model.width=3", "the config has no key model.width; model has ["),
    ("--config.parallel.mesh=data=3", "needs 3 devices but 8 are available"),
    ("--config.global_batch_size=12", "does not divide over data x fsdp = 8"),
    ("--config.data.name=imagenet", "config.data.name='imagenet' is not allowed"),
    ("--config.parallel.mesh=stage=2,data=4", "which only mode 'pp' uses"),
    ("--config.parallel.mode=pp", "needs the mesh axis stage > 1"),
    ("--config.parallel.pp.schedule=pipedream", "config.parallel.pp.schedule='pipedream' is not allowed"),
    ("--config.parallel.memory_budget_mb=-1", "config.parallel.memory_budget_mb must be >= 0"),
    ("--config.parallel.memory_budget_mb=0.01", "no checkpointing plan fits parallel.memory_budget_mb=0.01"),
    ("--config.parallel.offload=disk", "config.parallel.offload='disk' is not allowed"),
    ("--config.parallel.offload=auto", "config.parallel.offload='auto' lets the memory search decide"),
]


@pytest.mark.parametrize("override,message", BAD_CONFIGS)
def test_bad_config_fails_fast_naming_the_key(tmp_path, override, message):
    """train.py's flag parsing and main in this process (the same error text), the first case as a process of
    its own: the command's exit status and one-line error."""
    in_a_process = override == BAD_CONFIGS[0][0]
    result = (run_train if in_a_process else train_in_process)(tmp_path / "run", override)
    assert result.returncode != 0
    if in_a_process:
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-1500:]
    assert message in result.stderr, result.stderr[-1500:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_unknown_override_key_is_rejected(tmp_path):
    """In this process (train.py's main); as a process of its own: the test below."""
    result = train_in_process(tmp_path, "--config.learnng_rate=0.1")
    assert result.returncode == 2 and "learnng_rate" in result.stderr and "Traceback" not in result.stderr


def test_unknown_override_key_without_config_flag_is_rejected(tmp_path):
    """Without --config the default config loads while train.py is imported: the same one-line error."""
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config.learnng_rate=0.1"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "learnng_rate" in result.stderr and "Traceback" not in result.stderr


def test_every_model_option_can_be_overridden(tmp_path):
    result = train_in_process(tmp_path, "--config.model.spiking_neuron=PLIF", "--config.model.surrogate_function=atan",
                              "--config.num_steps=3", "--config.parallel.mode=none")
    assert result.returncode == 0, result.stderr[-1500:]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model"]["spiking_neuron"] == "PLIF" and config["model"]["surrogate_function"] == "atan"


def test_none_options_reach_the_model_and_the_command_line_sets_them(tmp_path):
    """``model.v_reset=None`` is SpikingJelly's soft reset: the built neurons get None (not the 0.0 default), from
    Python and from ``--config.model.v_reset=None``; a None for a key the config lacks is the one-line error."""
    from snnjax.neurons.modules import BaseNode  # noqa: PLC0415
    from snnjax.train import loop  # noqa: PLC0415

    c = load_config("digits")
    c.model.v_reset = None
    neurons = [m for _, m in nnx.iter_graph(loop.init_model(c, loop.make_sources(c)[0])) if isinstance(m, BaseNode)]
    assert neurons and all(m.v_reset is None for m in neurons)
    result = train_in_process(tmp_path, "--config.model.v_reset=None", "--config.num_steps=1",
                              "--config.parallel.mode=none")
    assert result.returncode == 0, result.stderr[-1500:]
    assert json.loads((tmp_path / "config.json").read_text())["model"]["v_reset"] is None
    result = train_in_process(tmp_path / "bad", "--config.model.v_resett=None")
    assert result.returncode == 2 and "the config has no key model.v_resett" in result.stderr


def test_model_config_validation_names_allowed_options():
    with pytest.raises(ValueError, match=r"has no option\(s\) \['width'\]; allowed:"):
        create_model("mlp", {"width": 3}, rngs=None)


def test_missing_data_directory(tmp_path):
    result = train_in_process(tmp_path / "run", "--config.data.name=nmnist",
                              f"--config.data.data_dir={tmp_path}/nowhere")
    assert result.returncode == 1
    assert "nowhere" in result.stderr and "error:" in result.stderr


def flip_bytes(step_dir: pathlib.Path, n: int = 64) -> pathlib.Path:
    """Invert ``n`` bytes in the middle of the step's largest array file (a disk or copy error); returns it."""
    f = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])
    f.write_bytes(bytes(data))
    return f


def test_corrupt_checkpoints_are_refused_and_a_damaged_latest_falls_back(tmp_path):
    c, _ = digits_run(**{"num_steps": 20, "checkpoint_every_steps": 10, "parallel.mode": "none"})
    train_and_evaluate(c, tmp_path)
    ckpts = tmp_path / "checkpoints"
    flip_bytes(ckpts / "10")
    flip_bytes(ckpts / "20")
    before = tree_hash(ckpts)
    c.num_steps, c.resume = 30, True  # (train.py prints such an error in one line: test_missing_data_directory)
    with pytest.warns(RuntimeWarning, match=f"checkpoint {ckpts / '20'} is corrupt: 1 file"), \
            pytest.raises(CheckpointError, match=f"none of the 2 checkpoints in {ckpts} passes its checks: .* "
                                                 f"checkpoint {ckpts / '10'} is corrupt: 1 file.* differ from its "
                                                 "digest sha256.json: state/.* \\(changed\\)"):
        train_and_evaluate(c, tmp_path)
    assert tree_hash(ckpts) == before  # nothing written, renamed or deleted

    flip_bytes(ckpts / "10")  # flipped back: step 10 is as saved again; 20 stays damaged
    damaged = tree_hash(ckpts / "20")
    with pytest.warns(RuntimeWarning) as warned:
        assert train_and_evaluate(c, tmp_path)["steps"] == 30
    first, second = (str(w.message) for w in warned)
    assert first.startswith(f"checkpoint {ckpts / '20'} is corrupt: 1 file(s) differ from its digest")
    assert second.startswith(f"resuming from checkpoint {ckpts / '10'}: the newer step(s) [20] failed their checks")
    assert tree_hash(ckpts / "20.corrupt") == damaged and sorted(p.name for p in ckpts.iterdir()) == [
        "10", "20", "20.corrupt", "30"]


def test_resume_without_checkpoint_and_fresh_run_over_checkpoints(tmp_path):
    c, _ = digits_run(**{"num_steps": 5, "parallel.mode": "none", "resume": True})
    with pytest.raises(CheckpointError, match="holds no checkpoint; run without --config.resume=True"):
        train_and_evaluate(c, tmp_path)
    c.resume = False
    train_and_evaluate(c, tmp_path)
    before = tree_hash(tmp_path / "checkpoints")
    with pytest.raises(CheckpointError, match="already holds checkpoints; pass --config.resume=True"):
        train_and_evaluate(c, tmp_path)
    assert tree_hash(tmp_path / "checkpoints") == before


def test_memory_budget_trains_with_the_plan_the_search_chose(tmp_path, capsys):
    c = load_config("digits")
    c.num_steps, c.parallel.mode, c.parallel.memory_budget_mb, c.parallel.offload = 2, "none", 1e4, "auto"
    summary = train_and_evaluate(c, tmp_path)
    assert summary["steps"] == 2
    out = capsys.readouterr().out
    assert "memory search: budget 10,000.0 MiB" in out and "chosen: remat=none, spike_residuals=float" in out
    assert "the memory search does not offload" in out  # the CPU's host memory is its device memory
    c.parallel.remat = "units"
    with pytest.raises(ValueError, match="memory_budget_mb > 0 lets the memory search choose parallel.remat"):
        validate(c)


def test_memory_budget_is_the_device_memory_auto_plans_for(tmp_path, capsys):
    c = load_config("digits")  # 0.3 MiB of replicated parameters, gradients and Adam state: over half of 0.5 MiB
    c.num_steps, c.parallel.mode, c.parallel.memory_budget_mb = 2, "auto", 0.5
    assert train_and_evaluate(c, tmp_path)["steps"] == 2
    assert "mode zero2 on data=8" in capsys.readouterr().out


def test_memory_budget_under_the_pipeline_chooses_the_microbatch_count(tmp_path, capsys):
    c = load_config("digits")
    c.num_steps, c.parallel.mode, c.parallel.mesh = 2, "pp", "stage=2,data=4"
    c.parallel.memory_budget_mb = 1e4
    summary = train_and_evaluate(c, tmp_path)
    assert summary["steps"] == 2
    out = capsys.readouterr().out
    assert "memory search: budget 10,000.0 MiB" in out and "1 compiled" in out
    m = choose_microbatches(64, 4, 2, 1, "1f1b")  # the fastest by the pipeline's time model fits: its own choice
    assert f"chosen: {m} microbatches, remat=none, spike_residuals=float" in out


def test_validate_rejects_bad_values():
    c = base_config()
    c.grad_accum_steps = 3
    with pytest.raises(ValueError, match="must divide by config.grad_accum_steps"):
        validate(c)
    c = base_config()
    c.learning_rate = -1.0
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        validate(c)


def test_the_config_loader_applies_overrides_and_names_what_is_wrong(tmp_path):
    """``config.load``: overrides read as each key's type (None included); a bad key, value or path is one line
    naming it; a run's saved config.json reads back as the config that wrote it."""
    c = load_config("digits", "--config.num_steps=3", "--config.model.v_reset=None", "--config.resume=true",
                    "--config.parallel.mesh=stage=2,data=-1", "--config.model.hidden=(8,4)", "data.data_dir=None")
    assert (c.num_steps, c.model.v_reset, c.resume, c.parallel.mesh, c.model.hidden, c.data.data_dir) == \
        (3, None, True, "stage=2,data=-1", (8, 4), None)
    for override, message in [("--config.learnng_rate=1", "--config.learnng_rate: the config has no key learnng_rate"),
                              ("--config.data.nme=x", "the config has no key data.nme; data has ["),
                              ("--config.num_steps=many", "--config.num_steps=many: num_steps is a number (int)"),
                              ("--config.resume=maybe", "resume is True or False"),
                              ("--config.parallel=none", "parallel is a group of keys"),
                              ("--config.num_steps", "write --config.KEY=VALUE")]:
        with pytest.raises(config_lib.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[")):
            load_config("digits", override)
    with pytest.raises(FileNotFoundError, match="config file nowhere.py does not exist"):
        config_lib.load("nowhere.py")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} is not a training run's directory"):
        config_lib.load(tmp_path)
    (tmp_path / "config.json").write_text(c.to_json_best_effort())
    assert config_lib.load(tmp_path).to_dict() == c.to_dict()
