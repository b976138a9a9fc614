"""A user-built SpikingJelly ``nn.Sequential`` (Conv-BN-LIF, MaxPool, Conv-BN-PLIF, Flatten, Linear) imports layer
by layer (``snnjax.interop.layers``) and reproduces SpikingJelly's float64 outputs, eval and train mode, with spikes
reaching the head.

The shipped ``tests/fixtures/spikingjelly/sequential.npz`` comes from ``make_sequential.py`` beside it; with
``SNNJAX_SJ_PYTHON`` (an interpreter with torch and SpikingJelly) the test also regenerates it live.
"""
from __future__ import annotations

import os
import pathlib
import subprocess

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import snnjax
from snnjax import layers
from snnjax.interop.layers import RULES, LayerRule, spikingjelly_inputs
from snnjax.interop.spikingjelly import import_state_dict
from snnjax.neurons import LIFNode, ParametricLIFNode

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "spikingjelly"


def user_net(dtype=None) -> snnjax.Sequential:
    """The same net as make_sequential.py's, layer for layer."""
    rngs = nnx.Rngs(0)
    return snnjax.Sequential(
        layers.conv2d(2, 6, 3, padding=1, rngs=rngs, param_dtype=dtype), layers.BatchNorm(6, param_dtype=dtype),
        LIFNode(tau=2.0, step_mode="m"), layers.MaxPool2d(2),
        layers.conv2d(6, 8, 3, padding=1, rngs=rngs, param_dtype=dtype), layers.BatchNorm(8, param_dtype=dtype),
        ParametricLIFNode(init_tau=2.0, step_mode="m"), layers.Flatten(),
        layers.linear(8 * 4 * 4, 10, rngs=rngs, param_dtype=dtype))


@nnx.jit
def forward(net: snnjax.Sequential, x):
    """The logits and (a second pass: eval mode only) the spikes the head reads, the last neuron's."""
    head = x
    for layer in list(net.layers)[:7]:
        head = layer(head)
    return net(x), head


@nnx.jit
def logits(net: snnjax.Sequential, x):
    return net(x)


def state_dict(arrays) -> dict[str, np.ndarray]:
    return {k[len("sd/"):]: arrays[k] for k in arrays if k.startswith("sd/")}


def check_reproduces(path: pathlib.Path) -> None:
    a = dict(np.load(path))
    net = user_net()
    report = import_state_dict(net, state_dict(a), dtype=jnp.float64)
    assert not report.leftover and not report.missing and len(report.imported) == 15
    assert report.ignored == ["1.num_batches_tracked", "5.num_batches_tracked"]
    x = spikingjelly_inputs(a["x"], batch_first=False)  # make_sequential.py's x is multi-step [T, N, C, H, W]
    net.eval()
    out, head = forward(net, x)
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(out), a["eval_out"], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(head), a["head_spikes"].transpose(0, 1, 3, 4, 2))
    assert a["head_spikes"].sum() > 10  # spikes reach the head: the comparison is not of zeros
    net.train()
    np.testing.assert_allclose(np.asarray(logits(net, x)), a["train_out"], rtol=0, atol=1e-12)
    for i in (1, 5):
        np.testing.assert_allclose(np.asarray(net.layers[i].mean.get_value()), a[f"train_sd/{i}.running_mean"],
                                   rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(net.layers[i].var.get_value()), a[f"train_sd/{i}.running_var"],
                                   rtol=0, atol=1e-12)


def test_shipped_sequential_reproduces_spikingjelly(x64):
    check_reproduces(FIXTURES / "sequential.npz")


@pytest.mark.skipif(not os.environ.get("SNNJAX_SJ_PYTHON"), reason="SNNJAX_SJ_PYTHON (torch + SpikingJelly) not set")
def test_live_sequential_reproduces_spikingjelly(tmp_path, x64):
    out = tmp_path / "sequential.npz"
    subprocess.run([os.environ["SNNJAX_SJ_PYTHON"], str(FIXTURES / "make_sequential.py"), str(out)], check=True,
                   timeout=300, capture_output=True)
    check_reproduces(out)


def test_report_names_casts_leftovers_and_missing_variables(x64):
    sd = state_dict(np.load(FIXTURES / "sequential.npz"))
    net = user_net()  # float32 parameters: importing float64 into them is a visible cast
    report = import_state_dict(net, sd)
    assert net.layers[0].kernel.get_value().dtype == jnp.float32
    assert "cast float64 -> float32; pass dtype=jnp.float64" in str(report)
    net = user_net()
    with pytest.raises(KeyError, match=r"1 keys .* no counterpart in Sequential, e\.g\. \['extra\.weight'\].*"
                       "allow_unused=True imports the rest"):
        import_state_dict(net, {**sd, "extra.weight": np.zeros(3)})
    assert not np.array_equal(np.asarray(net.layers[0].kernel[...]), sd["0.weight"].transpose(2, 3, 1, 0))
    report = import_state_dict(net, {**sd, "extra.weight": np.zeros(3)}, allow_unused=True)
    assert report.leftover == ["extra.weight"] and not report.missing
    np.testing.assert_allclose(np.asarray(net.layers[0].kernel[...]), sd["0.weight"].transpose(2, 3, 1, 0),
                               rtol=1e-6)
    with pytest.raises(KeyError, match=r"does not provide 1 (?s:.*)left over: extra\.weight(?s:.*)not provided: "
                       r"layers\.8\.bias"):  # missing variables: refused, allow_unused or not
        import_state_dict(user_net(), {**{k: v for k, v in sd.items() if k != "8.bias"}, "extra.weight": np.zeros(3)},
                          allow_unused=True)
    with pytest.raises(ValueError, match=r"0\.weight: shape \(6, 2, 3, 3\).*layers\.0\.kernel is \(3, 3, 2, 4\)"):
        bad = snnjax.Sequential(layers.conv2d(2, 4, 3, rngs=nnx.Rngs(0)))
        import_state_dict(bad, {"0.weight": sd["0.weight"]})


def test_float64_without_x64_says_how(x32_module):
    with pytest.raises(ValueError, match="jax_enable_x64"):
        import_state_dict(snnjax.Sequential(layers.Flatten()), {}, dtype=jnp.float64)


def test_rules_extend_by_one_entry(x64):
    class Scale(nnx.Module):
        def __init__(self):
            self.gain = nnx.Param(jnp.ones(3))

    RULES[Scale] = LayerRule({"g": ("gain", lambda a: a * 1.0)})
    try:
        net = snnjax.Sequential(Scale())
        report = import_state_dict(net, {"0.g": np.array([1.0, 2.0, 3.0])})
        assert report.imported[0].path == "layers.0.gain"
        np.testing.assert_array_equal(np.asarray(net.layers[0].gain.get_value()), [1.0, 2.0, 3.0])
        report = import_state_dict(net, {"layer.g": np.array([1.0, 2.0, 3.0])}, prefixes={"layer": ("layers", 0)},
                               rules={"layer": LayerRule({"g": ("gain", lambda a: a[::-1])})})
        np.testing.assert_array_equal(np.asarray(net.layers[0].gain.get_value()), [3.0, 2.0, 1.0])
    finally:
        del RULES[Scale]
