"""Activation checkpointing per unit and compressed spike residuals give ``none``'s loss and gradients.

Float64, small models; every policy and spike storage against the unconfigured model; the BatchNorm
statistics a checkpointed step writes equal ``none``'s; per-unit settings; bad settings name the problem.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import COMPILER_OPTIONS, suite_cases  # LLVM's optimisation level: compile time, not results

from snnjax.layers import conv_cpu
from snnjax.models import create_model, remat
from snnjax.train import memory_search
from snnjax.train.step import split_model

T, N = 3, 2
CASES = {
    "cifar10dvs_vgg": (dict(widths=(8, 8, 16), pools=(False, True, False), image_size=8, in_channels=2,
                            num_classes=4, dropout=0.0), (T, N, 8, 8, 2)),
    "spikformer": (dict(T=T, img_size_h=32,
                        img_size_w=32, in_channels=2, num_classes=4, embed_dims=32, num_heads=4, depths=2),
                   (T, N, 32, 32, 2)),
    "mlp": (dict(in_features=12, hidden=(16, 16), num_classes=4, spiking_neuron="PLIF"), (T, N, 12)),
}


def _loss_and_grads(model_name, settings):
    kwargs, shape = CASES[model_name]
    model = create_model(model_name, kwargs, rngs=nnx.Rngs(0), dtype=jnp.float64, param_dtype=jnp.float64)
    if settings is not None:
        remat.configure(model, settings)
    graphdef, params, rngs, rest = split_model(model)
    # Scaled up so that every layer spikes (a silent layer would make the comparison trivial).
    x = 3.0 * jax.random.uniform(jax.random.key(1), shape, jnp.float64)
    labels = jnp.arange(N) % 4

    def loss_fn(params, rngs, rest, x):
        m = nnx.merge(graphdef, params, *jax.tree.map(lambda v: v, (rngs, rest)))  # Variables of this trace
        logits = m(x)
        loss = -jnp.mean(jax.nn.log_softmax(logits.mean(0))[jnp.arange(N), labels])
        return loss, split_model(m)[3]

    args = (params, rngs, rest, x)
    step = jax.jit(jax.value_and_grad(loss_fn, has_aux=True)).lower(*args).compile(compiler_options=COMPILER_OPTIONS)
    (loss, new_rest), grads = step(*args)
    return loss, grads, new_rest


def _assert_same(a, b, rtol=1e-12):
    """Equal to ``rtol`` relative to the largest value of the tree (a BatchNorm-cancelled bias gradient is pure
    rounding, 1e-17, and is compared at the tree's scale)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    scale = max(float(np.max(np.abs(np.asarray(y)))) for y in lb)
    for x, y in zip(la, lb, strict=True):
        err = float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        assert err <= rtol * scale, (err, scale)


@pytest.fixture(scope="module")
def references(x64_module):
    return {name: _loss_and_grads(name, None) for name in CASES}


POLICIES = [("none", "bits"), ("none", "int8"), ("units", "float"), ("dots_saveable", "int8"), ("spikes", "float"),
            ("spikes", "bits")]
# Spikformer (the slowest to compile) under each policy once, its spikes stored each way once; in the suite, the
# two policies that recompute its attention blocks (SNNJAX_ALL_CASES=1: all four).
SPIKFORMER_POLICIES = suite_cases([("none", "int8"), ("units", "float"), ("dots_saveable", "int8"), ("spikes", "bits")],
                                  [("units", "float"), ("spikes", "bits")])


@pytest.mark.parametrize("model_name,policy,storage", [(m, p, s) for m in CASES for p, s in POLICIES
                                                       if m != "spikformer" or (p, s) in SPIKFORMER_POLICIES])
def test_policy_matches_none(references, model_name, policy, storage):
    loss0, grads0, rest0 = references[model_name]
    assert float(jnp.sum(jnp.abs(jax.tree.leaves(grads0)[0]))) > 0
    loss, grads, rest = _loss_and_grads(model_name, remat.settings(policy, storage))
    assert abs(float(loss) - float(loss0)) <= 1e-12 * abs(float(loss0))
    _assert_same(grads, grads0)
    _assert_same(rest, rest0)


def test_per_unit_policies(references):
    loss0, grads0, _ = references["spikformer"]
    settings = remat.settings({"stages.0": "spikes", "positional_encoding": "units", "blocks.1": "units",
                               "head": "dots_saveable"}, "bits")
    loss, grads, _ = _loss_and_grads("spikformer", settings)
    assert abs(float(loss) - float(loss0)) <= 1e-12 * abs(float(loss0))
    _assert_same(grads, grads0)
    assert settings.policy("blocks.0") == "none" and settings.policy("blocks.1") == "units"


# Compiled peaks only: the OTTT VGG (a Sequential whose units once began with the Scale after each neuron, and
# `units` checkpointing then kept more than `none`), at an input where activations dominate.
PEAK_CASES = {"ottt_spiking_vggws": (dict(cfg=(8, 16, "A", 16), in_channels=2, num_classes=4, spiking_neuron="LIF",
                                          v_reset=None), (4, 4, 16, 16, 2))}


def _peak(model_name, settings):
    """Compiled peak bytes of the gradient step (``memory_search.peak_bytes``), at a batch where activations
    dominate."""
    kwargs, shape = CASES[model_name] if model_name in CASES else PEAK_CASES[model_name]
    model = nnx.eval_shape(lambda: create_model(model_name, kwargs, rngs=nnx.Rngs(0)))
    if settings is not None:
        remat.configure(model, settings)
    graphdef, params, rngs, rest = split_model(model)

    def loss_fn(params, rngs, rest, x):
        return nnx.merge(graphdef, params, *jax.tree.map(lambda v: v, (rngs, rest)))(x).sum()

    x = jax.ShapeDtypeStruct((8, 16) + shape[2:] if model_name in CASES else shape, jnp.float32)
    compiled = jax.jit(jax.grad(loss_fn)).lower(params, rngs, rest, x).compile(compiler_options=COMPILER_OPTIONS)
    return memory_search.peak_bytes(compiled)[0]  # buffer assignment: the same at LLVM's every optimisation level


@pytest.mark.parametrize("model_name", ["cifar10dvs_vgg"])
def test_policies_lower_the_compiled_peak(x32_module, model_name):
    none = _peak(model_name, None)
    bits = _peak(model_name, remat.settings("none", "bits"))
    spikes = _peak(model_name, remat.settings("spikes", "float"))
    spikes_bits = _peak(model_name, remat.settings("spikes", "bits"))
    units = _peak(model_name, remat.settings("units", "float"))
    assert bits < none
    assert units < none
    assert spikes < none
    assert spikes_bits <= spikes


def test_units_lower_the_ottt_vgg_peak(x32_module):
    """With XLA's convolutions. The sparse-input kernels' per-call choice (a ``lax.cond``) keeps more buffers alive
    around each convolution: at these 8-16 channels that alone lifts the units peak above no remat's (1.25 MB
    against 1.13 MB; 1.06 / 1.16 MB with XLA's convolutions); at the OTTT VGG's 64-512 channels units take the peak
    from 131 MB to 101 MB either way (docs/memory.md)."""
    with conv_cpu.sparse_inputs(False):
        assert _peak("ottt_spiking_vggws", remat.settings("units", "float")) < _peak("ottt_spiking_vggws", None)


def test_bad_settings_say_what_is_allowed():
    model = create_model("mlp", CASES["mlp"][0], rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="remat policy must be one of"):
        remat.configure(model, "everything")
    with pytest.raises(ValueError, match="spike_residuals must be one of"):
        remat.configure(model, "none", "int4")
    with pytest.raises(ValueError, match="does not have"):
        remat.configure(model, {"blocks.9": "units"})
