"""``snnjax.trainer`` on a user's own model: the same training under any layout, checkpoints across layouts,
``load_model``, and errors that name the Python argument to change.

Equivalence runs in float64 (a 1-ulp change can flip a spike): a small spiking conv net (``snnjax.Sequential``)
trained two steps on one device, under ``fsdp=4,tensor=2`` and under a pipeline ``stage=2,data=4`` reaches the
same loss and parameters. Programs compile with ``conftest.quick_compiles``.
"""
from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import snnjax
from snnjax import layers, parallel
from snnjax.neurons import LIFNode
from snnjax.train import Trainer, base_config
from snnjax.train.checkpoint import CheckpointError

pytestmark = pytest.mark.usefixtures("quick_compiles_module")


def small_net(dtype=jnp.float64, annotate: bool = True) -> snnjax.Sequential:
    """Conv-BN-LIF x2 and a linear head on [T, N, 8, 8, 2]; tensor-parallel names when ``annotate``."""
    rngs = nnx.Rngs(0)
    ax = (lambda *names: names) if annotate else (lambda *names: None)
    return snnjax.Sequential(
        layers.conv2d(2, 8, 3, padding=1, rngs=rngs, param_dtype=dtype, axes=ax("embed", "mlp")),
        layers.BatchNorm(8, param_dtype=dtype, axes=ax("mlp")), LIFNode(tau=2.0, step_mode="m"),
        layers.MaxPool2d(2),
        layers.conv2d(8, 8, 3, padding=1, rngs=rngs, param_dtype=dtype, axes=ax("mlp", "embed")),
        layers.BatchNorm(8, param_dtype=dtype, axes=ax("embed")), LIFNode(tau=2.0, step_mode="m"),
        layers.Flatten(), layers.linear(8 * 4 * 4, 10, rngs=rngs, param_dtype=dtype, axes=ax("embed", "classes")))


def batches(n: int = 2, dtype=np.float64):
    rng = np.random.default_rng(0)
    return [{"inputs": (rng.random((2, 8, 8, 8, 2)) < 0.4).astype(dtype) * 2.0, "labels": rng.integers(0, 10, 8)}
            for _ in range(n)]


def flat_params(model):
    return {k: np.asarray(v.get_value()) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.fixture(scope="module")
def trained(x64_module, tmp_path_factory):
    """Two steps under each layout: ``{layout: (losses, model, trainer)}``."""
    data = batches()
    out = {}
    # One microbatch: BatchNorm's batch statistics are then those of the whole batch, as on one device.
    whole = parallel.PipelineOptions(microbatches=1)
    for layout, devices, pipeline in (("data=1", jax.devices()[:1], None), ("fsdp=4,tensor=2", None, None),
                                      ("stage=2,data=4", None, whole)):
        tr = snnjax.trainer(small_net(), layout, optax.adam(1e-2), devices=devices, example=data[0],
                            pipeline=pipeline, dtype=jnp.float64, verbose=False)
        losses = [tr.step(b)["loss"] for b in data]
        out[layout] = (losses, tr.model(), tr)
    return out


def test_layouts_train_alike(trained):
    ref_losses, ref_model, _ = trained["data=1"]
    ref = flat_params(ref_model)
    assert trained["stage=2,data=4"][2].plan.mode == "pp" and trained["fsdp=4,tensor=2"][2].plan.mode == "fsdp_tp"
    for layout in ("fsdp=4,tensor=2", "stage=2,data=4"):
        losses, model, _ = trained[layout]
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-12, err_msg=layout)
        got = flat_params(model)
        assert got.keys() == ref.keys()
        # atol: a conv bias before a BatchNorm has a zero gradient, so its value is rounding noise (gradients of
        # ~1e-16) that Adam scales to lr * g / eps ~ 1e-10; every other parameter is held to rtol 1e-9.
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-9, atol=1e-9, err_msg=f"{layout} {k}")
    assert ref_losses[1] != ref_losses[0]  # the step changed the parameters


def test_checkpoint_of_a_pipeline_restores_anywhere_and_loads_into_a_model(trained, tmp_path):
    losses, model, tr = trained["stage=2,data=4"]
    where = tr.save(tmp_path / "ckpt")
    assert where.name == "2"
    with pytest.raises(CheckpointError, match="overwrite=True"):
        tr.save(tmp_path / "ckpt")
    tr.save(tmp_path / "ckpt", overwrite=True)
    loaded = snnjax.load_model(small_net(), tmp_path / "ckpt")
    want, got = flat_params(model), flat_params(loaded)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    np.testing.assert_array_equal(np.asarray(loaded.layers[1].mean.get_value()),
                                  np.asarray(model.layers[1].mean.get_value()))
    other = snnjax.trainer(small_net(), "fsdp=4,tensor=2", optax.adam(1e-2), dtype=jnp.float64, verbose=False)
    assert other.restore(tmp_path / "ckpt") == 2
    for k, v in flat_params(other.model()).items():
        np.testing.assert_array_equal(v, want[k], err_msg=k)
    metrics = other.evaluate([{"inputs": b["inputs"][:, :5], "labels": b["labels"][:5]} for b in batches(1)])
    assert 0.0 <= metrics["accuracy"] <= 1.0 and np.isfinite(metrics["loss"])


def test_input_layout_errors_name_the_layout(trained):
    _, _, tr = trained["fsdp=4,tensor=2"]
    b = batches(1)[0]
    with pytest.raises(ValueError, match=r"\[T, N, H, W, C\].*batch-first.*swapaxes\(0, 1\)"):
        tr.step({"inputs": b["inputs"].swapaxes(0, 1), "labels": b["labels"]})
    with pytest.raises(ValueError, match="lacks \\['labels'\\]"):
        tr.step({"inputs": b["inputs"]})
    with pytest.raises(ValueError, match="multiple of 4"):
        tr.step({"inputs": b["inputs"][:, :6], "labels": b["labels"][:6]})


def test_device_count_errors_say_how_to_fix():
    with pytest.raises(ValueError, match=r"devices=jax.devices\(\)\[:4\]"):
        parallel.make_mesh("fsdp=4")
    with pytest.raises(ValueError, match=r"xla_force_host_platform_device_count=16 set before JAX starts.*restart "
                                         "the kernel"):
        parallel.make_mesh("fsdp=16")
    assert snnjax.trainer(small_net(jnp.float32), "fsdp=4", devices=jax.devices()[:4], verbose=False).mesh.size == 4


def test_annotations_cannot_silently_do_nothing():
    net = small_net(jnp.float32)
    with pytest.raises(ValueError, match="unknown logical axis name.*'embd'.*'embed'"):
        parallel.annotate(net.layers[0].kernel, "window", "window", "embd", "mlp")
    with pytest.warns(UserWarning, match="no parameter|has none"):
        parallel.plan(small_net(jnp.float32, annotate=False), parallel.make_mesh("fsdp=4,tensor=2"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel.plan(net, parallel.make_mesh("fsdp=4,tensor=2"))


class NoUnits(nnx.Module):
    def __init__(self):
        self.fc = layers.linear(4, 2, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.fc(x)


def test_a_pipeline_of_a_model_without_units_says_what_units_returns():
    with pytest.raises(ValueError, match=r"(?s)NoUnits has no units\(\).*Unit\(name, owns, fn\).*snnjax.Sequential"):
        parallel.plan(NoUnits(), parallel.make_mesh("stage=2,data=4"), mode="pp",
                      pipeline=parallel.PipelineOptions(microbatches=2))
    with pytest.raises(ValueError, match=r"example=batch.*pipeline=snnjax.parallel.PipelineOptions"):
        snnjax.trainer(small_net(jnp.float32), "stage=2,data=4")


def test_the_package_exports_what_a_notebook_needs():
    assert isinstance(snnjax.__version__, str) and snnjax.__version__
    assert snnjax.PipelineOptions is parallel.PipelineOptions
    assert parallel.AXES == ("data", "fsdp", "tensor", "stage", "time")
    assert "time" in parallel.__doc__.splitlines()[0]


def test_the_config_trainer_takes_a_users_model_and_logs_firing_rates(tmp_path):
    c = base_config()  # digits: [N, 8, 8, 1] images, repeated over T = 4 steps
    c.num_steps, c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps, c.global_batch_size = 4, 2, 4, 4, 32
    c.monitor.firing_rates = True
    rngs = nnx.Rngs(0)
    mine = snnjax.Sequential(layers.Flatten(), layers.linear(64, 32, rngs=rngs), LIFNode(step_mode="m"),
                             layers.linear(32, 10, rngs=rngs))
    trainer = Trainer(c, tmp_path, model=mine)
    summary = trainer.run()
    assert summary["model"] == "Sequential" and summary["steps"] == 4
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rates = [r for r in records if "firing_rate/layers.2" in r]
    assert [r["step"] for r in rates] == [4] and 0.0 <= rates[0]["firing_rate/layers.2"] <= 1.0
    trained = trainer.model()
    assert isinstance(trained, snnjax.Sequential)
    loaded = snnjax.load_model(snnjax.Sequential(layers.Flatten(), layers.linear(64, 32, rngs=rngs),
                                                 LIFNode(step_mode="m"), layers.linear(32, 10, rngs=rngs)), tmp_path)
    np.testing.assert_array_equal(np.asarray(loaded.layers[1].kernel.get_value()),
                                  np.asarray(trained.layers[1].kernel.get_value()))
