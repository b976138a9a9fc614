"""``snnjax.ann2snn.Converter`` against SpikingJelly's rate-coding converter (``fixtures/spikingjelly/ann2snn.npz``,
from ``make_ann2snn.py``): the same ReLU CNN and calibration batches give the same statistic per ReLU and the same
SNN outputs at every step (float64), in each mode; and the digits recipe's converted accuracy approaches the ANN's.
"""
from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import snnjax
from snnjax import layers
from snnjax.ann2snn import Converter, VoltageScaler, digits
from snnjax.interop.spikingjelly import import_state_dict
from snnjax.neurons import IFNode

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "spikingjelly"
CASES = {  # make_ann2snn.py's CASES
    "max": {"mode": "max"},
    "robust": {"mode": "99.9%"},
    "half": {"mode": 0.5, "momentum": 0.3},
    "max_unfused": {"mode": "Max", "fuse_flag": False},
}


def nhwc(x: np.ndarray) -> np.ndarray:
    return np.moveaxis(x, -3, -1)


@nnx.jit
def run(net, x):
    return net(x)


def make_ann_relu_cnn(golden) -> snnjax.Sequential:
    """make_ann2snn.py's ANN, layer for layer, with its float64 weights (zero-initialised first: no random init)."""
    rngs, f64, zero = nnx.Rngs(0), jnp.float64, nnx.initializers.zeros_init()
    ann = snnjax.Sequential(
        layers.conv2d(2, 6, 3, padding=1, kernel_init=zero, rngs=rngs, param_dtype=f64),
        layers.BatchNorm(6, param_dtype=f64), layers.ReLU(), layers.MaxPool2d(2),
        layers.conv2d(6, 8, 3, padding=1, use_bias=False, kernel_init=zero, rngs=rngs, param_dtype=f64),
        layers.BatchNorm(8, param_dtype=f64), layers.ReLU(), layers.AvgPool2d(2), layers.Flatten(),
        layers.linear(32, 12, kernel_init=zero, rngs=rngs, param_dtype=f64), layers.BatchNorm(12, param_dtype=f64),
        layers.ReLU(), layers.linear(12, 10, kernel_init=zero, rngs=rngs, param_dtype=f64))
    import_state_dict(ann, {k[3:]: v for k, v in golden.items() if k.startswith("sd/")}, dtype=f64)
    ann.eval()
    return ann


def test_digits_recipe_approaches_the_ann():
    """The recipe's evaluation at a tiny size: a width-4 ReLU CNN whose head is fitted in closed form (least squares
    on its random conv features; no training steps), converted; the SNN's accuracy rises with T towards the ANN's.
    First in the file: it runs in float32, before the golden fixture switches x64 on for the module."""
    x, y = digits.split_arrays("all")  # one read of the digits: the head is fitted on 1200 images, tested on the rest
    train_x, train_y, test_x, test_y = x[:1200], y[:1200], x[1200:], y[1200:]
    ann = digits.relu_cnn(4, rngs=nnx.Rngs(0))
    ann.eval()
    features = np.asarray(run(snnjax.Sequential(*list(ann.layers)[:-1]), jnp.asarray(train_x)[None])[0])
    features = np.concatenate([features, np.ones((len(features), 1), np.float32)], axis=1)
    head, *_ = np.linalg.lstsq(features, np.eye(10, dtype=np.float32)[train_y], rcond=None)
    ann.layers[-1].kernel[...], ann.layers[-1].bias[...] = jnp.asarray(head[:-1]), jnp.asarray(head[-1])
    calibration = [train_x[i:i + 128] for i in range(0, 512, 128)]
    r = digits.evaluate(ann, calibration, test_x, test_y, modes=("99.9%",), time_steps=(4, 16, 64))
    acc = r["99.9%"]
    assert r["ann"] > 0.75  # 0.83 (the head fitted to random conv features)
    assert acc[4] < acc[16] < acc[64] and acc[64] > r["ann"] - 0.03  # 0.25, 0.69, 0.81


@pytest.fixture(scope="module")
def golden(x64_module):
    a = dict(np.load(FIXTURES / "ann2snn.npz"))
    return a, make_ann_relu_cnn(a)


@pytest.mark.parametrize("case", sorted(CASES))
def test_converter_matches_spikingjelly(golden, case):
    a, ann = golden
    loader = [(nhwc(b), np.zeros(len(b), np.int32)) for b in a["calib"]]  # (images, labels), as SpikingJelly's
    before = nnx.state(ann)
    snn = Converter(dataloader=loader, **CASES[case]).convert(ann)
    assert jnp.array_equal(nnx.state(ann)["layers"][0]["kernel"][...], before["layers"][0]["kernel"][...])
    scalers = [m for m in snn.layers if isinstance(m, VoltageScaler)]
    scales = np.array([float(s.scale[...]) for s in scalers])
    np.testing.assert_allclose(scales[1::2], a[f"{case}/scales"], rtol=1e-12, atol=0)  # the statistic per ReLU
    np.testing.assert_allclose(scales[0::2], 1.0 / a[f"{case}/scales"], rtol=1e-12, atol=0)
    # folded: conv, scaler, IF, scaler, pool, conv, ... ; unfused: every BatchNorm stays
    kinds = [type(m).__name__ for m in snn.layers]
    assert kinds.count("BatchNorm") == (3 if case == "max_unfused" else 1)
    assert kinds.count("IFNode") == 3 and all(m.v_reset is None for m in snn.layers if isinstance(m, IFNode))
    want = a[f"{case}/out"]
    x = jnp.broadcast_to(jnp.asarray(nhwc(a["x"])), (want.shape[0], *nhwc(a["x"]).shape))
    out = np.asarray(run(snn, x))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-9)
    assert (a[f"{case}/rates"] > 0.02).all()  # every IF layer fires: not a comparison of silent layers


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "mean"}, "mode"), ({"mode": "101%"}, "mode"), ({"mode": 1.5}, "mode"), ({"mode": True}, "mode"),
    ({"momentum": 2.0}, "momentum"), ({"fuse_flag": 1}, "fuse_flag"),
])
def test_bad_keywords_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Converter(dataloader=[], **kwargs)


def test_bad_inputs_are_named(golden):
    _, ann = golden
    with pytest.raises(ValueError, match="no batch"):
        Converter(dataloader=[]).convert(ann)
    with pytest.raises(ValueError, match=r"ann.layers\[1\] is a LIFNode"):
        Converter(dataloader=[]).convert(snnjax.Sequential(layers.Flatten(), snnjax.neurons.LIFNode()))
    with pytest.raises(TypeError, match="snnjax.Sequential"):
        Converter(dataloader=[]).convert(layers.ReLU())
