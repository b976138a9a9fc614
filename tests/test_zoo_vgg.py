"""SpikingJelly's spiking VGG family (``spiking_vgg11/13/16/19``, ``_bn``): sizes, errors, golden data, layouts.

The golden data (``tests/fixtures/spikingjelly/vgg.npz``, ``make_reference_vgg.py``) come from SpikingJelly's
full-size models on 32 x 32 images; their weights are regenerated here from the json's per-key recipe (seeded
PCG64 streams) and imported as a SpikingJelly ``state_dict``; the model is built with SpikingJelly's constructor
call (``spiking_vgg11_bn(spiking_neuron=LIFNode, tau=2.0, ...)``). Eval and train logits, loss, every gradient (whole
for small tensors, four layout-independent numbers for large ones) and the BatchNorm statistics after the train
forward are compared in float64. The suite checks ``spiking_vgg11_bn`` (about 1 GB of float64 weights);
``SNNJAX_ALL_CASES=1`` checks every case of the file.

The layouts: a small VGG (three conv blocks, so its features leave the last conv channel-split) trains two
Adam steps under FSDP x tensor and a two-stage pipeline exactly as on one device (float64).
"""
from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import REFERENCE_DIR
from flax import nnx
from helpers import suite_cases
from seeded import seeded_uniform

import snnjax
from snnjax import layers, models, neurons
from snnjax.interop.check import parse_surrogate
from snnjax.interop.spikingjelly import import_state_dict
from snnjax.models import SpikingVGG
from snnjax.models.registry import DataShape, create_model, sizes_from_data
from snnjax.models.spiking_vgg import CFGS
from snnjax.parallel.pipeline_plan import PipelineOptions

# Programs compile with conftest's quick_compiles: the full-size golden test too (its eval and train programs
# compile in less time than XLA's optimisations save when they run, T=2, N=2 at 32 x 32).
pytestmark = pytest.mark.usefixtures("quick_compiles_module")

FIXTURE = REFERENCE_DIR / "vgg.npz"
META = json.loads(FIXTURE.with_suffix(".json").read_text())
CASES = suite_cases(sorted(META), ("spiking_vgg11_bn",))
TOL = 1e-10
# torchvision's VGG parameter counts (IF neurons have none), 1000 classes
TORCHVISION = {"spiking_vgg11": 132_863_336, "spiking_vgg11_bn": 132_868_840, "spiking_vgg13": 133_047_848,
               "spiking_vgg13_bn": 133_053_736, "spiking_vgg16": 138_357_544, "spiking_vgg16_bn": 138_365_992,
               "spiking_vgg19": 143_667_240, "spiking_vgg19_bn": 143_678_248}


def _abstract(name: str, **kwargs) -> SpikingVGG:
    return nnx.eval_shape(lambda: getattr(models, name)(**kwargs))


@pytest.mark.parametrize("name", sorted(TORCHVISION))
def test_sizes_are_torchvisions(name):
    model = _abstract(name, spiking_neuron=neurons.IFNode)
    assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == TORCHVISION[name]
    depth = int(name.removeprefix("spiking_vgg")[:2])
    assert len(model.features) == depth - 3 and sum(b.pools for b in model.features) == 5
    assert hasattr(model.features[0], "bn") == name.endswith("_bn")
    assert model.fc1.kernel.shape == (512 * 49, 4096) and model.fc3.kernel.shape == (4096, 1000)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="needs spiking_neuron"):
        models.spiking_vgg11()
    with pytest.raises(ValueError, match="pretrained=True"):
        models.spiking_vgg11(pretrained=True, spiking_neuron=neurons.IFNode)
    with pytest.raises(ValueError, match="norm_layer"):
        models.spiking_vgg11_bn(norm_layer=nnx.BatchNorm, spiking_neuron=neurons.IFNode)
    with pytest.raises(ValueError, match="SpikingVGG takes no keyword 'tau'"):
        models.spiking_vgg13(spiking_neuron=neurons.IFNode, tau=2.0)
    with pytest.raises(ValueError, match="model.cfg"):
        SpikingVGG(cfg=("M", 8), spiking_neuron="IF")
    with pytest.raises(ValueError, match="at least 32x32"):
        sizes_from_data("spiking_vgg11", DataShape((16, 16, 2), 10, 2))
    assert sizes_from_data("spiking_vgg16_bn", DataShape((32, 32, 2), 10, 2)) == {"in_channels": 2, "num_classes": 10}


@pytest.mark.parametrize("size,out", [((5, 9), (3, 4)), ((4, 4), (7, 7)), ((14, 14), (7, 7)), ((1, 1), (7, 7))])
def test_adaptive_avg_pool_is_torchs(size, out):
    """Each output cell the mean of its window ``floor(i * H / oh) .. ceil((i + 1) * H / oh)`` (torch's rule)."""
    x = np.random.default_rng(0).normal(size=(2, *size, 3))
    want = np.zeros((2, *out, 3))
    for i in range(out[0]):
        for j in range(out[1]):
            rows = slice(i * size[0] // out[0], -(-(i + 1) * size[0] // out[0]))
            cols = slice(j * size[1] // out[1], -(-(j + 1) * size[1] // out[1]))
            want[:, i, j] = x[:, rows, cols].mean(axis=(1, 2))
    np.testing.assert_allclose(layers.adaptive_avg_pool2d(jnp.asarray(x, jnp.float32), out), want, rtol=1e-5,
                               atol=1e-6)


def regenerate(meta: dict) -> dict[str, np.ndarray]:
    """The case's SpikingJelly ``state_dict``: ``offset + scale * u``, ``u`` the key's ``seeded_uniform``."""
    out = {}
    for key, (shape, scale, offset) in meta["weights"].items():
        out[key] = seeded_uniform(meta["seed"], key, shape)
        out[key] *= scale  # in place (the classifier's first weight alone is 0.8 GB)
        out[key] += offset
    return out


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


@pytest.mark.parametrize("name", CASES)
def test_matches_spikingjelly(name, x64):
    meta = META[name]
    with np.load(FIXTURE) as f:
        arrays = {k.split("/", 1)[1]: f[k] for k in f.files if k.startswith(f"{name}/")}
    kwargs = {k: parse_surrogate(v) if k == "surrogate_function" else v for k, v in meta["kwargs"].items()}
    kwargs.update(spiking_neuron=getattr(neurons, meta["spiking_neuron"]), dropout=0.0)  # SpikingJelly's were off
    # SpikingJelly's constructor call, abstract: its ~130M parameters come from the import (drawing random ones
    # first would take as long); its other state (dropout RNG streams, scalar membrane potentials) is that of the
    # same model at width 1, the same tree
    model = _abstract(meta["constructor"], num_classes=meta["num_classes"], **kwargs)
    report = import_state_dict(model, regenerate(meta), dtype=jnp.float64)
    narrow = SpikingVGG(tuple(v if v == "M" else 1 for v in model.cfg), model.batch_norm, hidden_features=1,
                        num_classes=1, **kwargs)
    nnx.update(model, nnx.state(narrow, nnx.Not(nnx.Any(nnx.Param, nnx.BatchStat))))
    path_of = {i.key: i.path for i in report.imported}
    x = jnp.asarray(arrays["x"].transpose(0, 1, 3, 4, 2))  # [T, N, C, H, W] -> [T, N, H, W, C]
    labels = jnp.asarray(arrays["labels"])

    model.eval()
    assert _rel(nnx.jit(lambda m, x: m(x))(model, x), arrays["logits_eval"]) < TOL
    model.train()

    def loss_fn(model):
        logits = model(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits.mean(0), labels).mean(), logits

    (loss, logits), grads = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))(model)
    assert _rel(logits, arrays["logits_train"]) < TOL and _rel(loss, arrays["loss_train"]) < TOL
    grads = {".".join(map(str, p)): v[...] for p, v in nnx.to_flat_state(grads)}
    params = {".".join(map(str, p)): v[...] for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    full = {k.removeprefix("grad/"): v for k, v in arrays.items() if k.startswith("grad/")}
    summaries = {k.removeprefix("grad_summary/"): v for k, v in arrays.items() if k.startswith("grad_summary/")}
    assert set(path_of[k] for k in [*full, *summaries]) == set(grads)  # every gradient checked
    # the conv biases before BatchNorm have zero gradients: their rounding noise is compared to the whole gradient
    floor = 1e-6 * np.sqrt(sum(float(s[0]) ** 2 for s in summaries.values()))
    for key, want in full.items():
        got = np.asarray(grads[path_of[key]]).reshape(want.shape)  # the few tensors stored whole keep their layout
        assert np.linalg.norm(got - want) <= TOL * max(np.linalg.norm(want), floor), key
    for key, want in summaries.items():
        g, w = grads[path_of[key]], params[path_of[key]]
        got = np.array([jnp.linalg.norm(g), jnp.sum(g), jnp.vdot(g, w), jnp.abs(g).max()])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=TOL * float(want[0]), err_msg=key)
    stats = {".".join(map(str, p)): v[...] for p, v in nnx.to_flat_state(nnx.state(model, nnx.BatchStat))}
    after = {k.removeprefix("after_train_step_state/"): v for k, v in arrays.items()
             if k.startswith("after_train_step_state/")}
    assert len(after) == len(stats) == 2 * len(model.features) * name.endswith("_bn")
    for key, want in after.items():
        assert _rel(stats[path_of[key]], want) < TOL, key


def test_import_refuses_another_variant():
    meta = META["spiking_vgg11"]
    sd = {k: np.zeros(shape) for k, (shape, _, _) in meta["weights"].items() if not k.startswith("classifier")}
    sd.update({k: np.zeros(shape) for k, (shape, _, _) in META["spiking_vgg11_bn"]["weights"].items()
               if k.startswith("classifier.6")})
    model = nnx.eval_shape(lambda: SpikingVGG(cfg=CFGS[11], batch_norm=True,
                                              spiking_neuron="IF", num_classes=10, hidden_features=8))
    with pytest.raises((KeyError, ValueError)):  # weights without BatchNorm into the _bn variant
        import_state_dict(model, sd)


# -- layouts ------------------------------------------------------------------------------------------------------

def _small(batch_norm: bool) -> SpikingVGG:
    return SpikingVGG(cfg=(4, "M", 8, "M", 8), batch_norm=batch_norm, spiking_neuron=neurons.LIFNode,
                      detach_reset=True, in_channels=2, hidden_features=16, num_classes=10,
                      dropout=0.25 if batch_norm else 0.0, rngs=nnx.Rngs(params=0, dropout=1), dtype=jnp.float64,
                      param_dtype=jnp.float64)


@functools.cache
def _batch():
    rng = np.random.default_rng(0)
    return {"inputs": (rng.random((2, 8, 16, 16, 2)) < 0.5).astype(np.float64) * 2.0,
            "labels": rng.integers(0, 10, 8).astype(np.int32)}


def _train(batch_norm: bool, layout: str, devices: int, **kw):
    trainer = snnjax.trainer(_small(batch_norm), layout, optax.adam(1e-3), devices=jax.devices()[:devices],
                             dtype=jnp.float64, verbose=False, **kw)
    losses = [trainer.step(_batch())["loss"] for _ in range(2)]
    return losses, nnx.state(trainer.model(), nnx.Param)


@pytest.mark.parametrize("batch_norm,layout,devices,kw", [
    (True, "fsdp=2,tensor=2", 4, {}),
    (False, "stage=2,data=2", 4, {"pipeline": PipelineOptions("1f1b", 1, 2)}),  # no BatchNorm: microbatches agree
])
def test_layouts_train_as_one_device(batch_norm, layout, devices, kw, x64):
    ref_losses, ref = _train(batch_norm, "data=1", 1)
    losses, params = _train(batch_norm, layout, devices, **kw)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-9)
    assert ref_losses[0] != ref_losses[1]  # the step changed the model
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref), strict=True):  # conv biases before BatchNorm:
        assert np.linalg.norm(np.asarray(a) - b) <= 1e-9 * max(np.linalg.norm(b), 1e-6)  # zero gradient, noise


def test_registry_builds_every_variant():
    for name in TORCHVISION:
        model = nnx.eval_shape(lambda n=name: create_model(n, {"in_channels": 2, "num_classes": 10,
                                                                 "spiking_neuron": "PLIF"}, rngs=nnx.Rngs(0)))
        assert model.cfg == CFGS[int(name[11:13])] and model.batch_norm == name.endswith("_bn")
