"""Neuron dtypes (float32 / bfloat16 inputs) and surrogate-function checks, with x64 off.

- The state is float32 for float32 and bfloat16 inputs; spikes and input gradients
  come back in the input dtype; PLIF's dw in w's dtype.
- A bfloat16 run is the float32 run of the same (exactly upcast) input: the state
  is float32 in both, so spikes and v agree exactly and dx to bfloat16 rounding.
- float32 ``multistep`` (``impl="auto"``, what a model gets) agrees with autodiff ``multistep_reference``.
- Each surrogate's ``grad`` is the derivative of its ``primitive``; ``spike`` is the
  Heaviside step with value 1 at 0 and the surrogate derivative as its JVP.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from neuron_checks import low_precision_problem

from snnjax import neurons as F
from snnjax.neurons import modules as M
from snnjax.neurons import surrogate as sg
from snnjax.neurons.compare import REFERENCE, rel_error, run_vjp

pytestmark = pytest.mark.usefixtures("x32_module")


CONFIGS = {
    "IF-hard-detach": F.NeuronConfig(kind="IF", detach_reset=True),
    "LIF-hard": F.NeuronConfig(kind="LIF", tau=2.0, v_reset=-0.25),
    "LIF-soft-nodi-atan": F.NeuronConfig(kind="LIF", tau=1.5, decay_input=False, v_reset=None, surrogate=sg.ATan()),
    "PLIF-soft": F.NeuronConfig(kind="PLIF", v_reset=None),
    "PLIF-hard-nodi": F.NeuronConfig(kind="PLIF", decay_input=False, surrogate=sg.SoftSign()),
}
IMPLS = ("auto", REFERENCE)  # auto: native on one CPU device; every impl is held to XLA in test_neuron_impls.py
SHAPE = (6, 4, 33)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_output_and_gradient_dtypes(name, dtype, impl):
    cfg = CONFIGS[name]
    x, v_init, w, ct_s, ct_v = low_precision_problem(cfg, SHAPE, dtype, return_v_seq=True)
    (s, v), (dx, dv, dw) = run_vjp(impl, cfg, True, x, v_init, w, ct_s, ct_v)
    assert s.dtype == dtype and s.shape == SHAPE
    assert v.dtype == jnp.float32 and v.shape == SHAPE
    assert dx.dtype == dtype and dx.shape == SHAPE
    assert dv.dtype == jnp.float32 and dv.shape == SHAPE[1:]
    if cfg.kind == "PLIF":
        assert dw.dtype == jnp.float32 and dw.shape == ()
    assert set(np.unique(np.asarray(s, np.float32))) <= {0.0, 1.0}
    assert 0 < float(jnp.mean(s.astype(jnp.float32))) < 1, "the example should fire some but not all"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_bfloat16_run_is_the_float32_run_of_the_same_input(name):
    cfg = CONFIGS[name]
    x, v_init, w, ct_s, ct_v = low_precision_problem(cfg, SHAPE, jnp.bfloat16, True, seed=1)  # compiles reused
    (s16, v16), (dx16, _, _) = run_vjp("auto", cfg, True, x, v_init, w, ct_s, ct_v)
    (s32, v32), (dx32, _, _) = run_vjp(
        "auto", cfg, True, x.astype(jnp.float32), v_init, w, ct_s.astype(jnp.float32), ct_v)
    np.testing.assert_array_equal(np.asarray(s16, np.float32), np.asarray(s32))
    np.testing.assert_array_equal(np.asarray(v16), np.asarray(v32))
    np.testing.assert_array_equal(np.asarray(dx16, np.float32), np.asarray(dx32.astype(jnp.bfloat16), np.float32))


@pytest.mark.parametrize("return_v_seq", [False, True], ids=["v_last", "v_seq"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_float32_custom_vjp_agrees_with_autodiff(name, return_v_seq):
    cfg = CONFIGS[name]
    # Same shapes and seed as the dtype test, so the return_v_seq=True compiles are reused;
    # the v_last variant starts from the default state (v_init=None).
    x, v_init, w, ct_s, ct_v = low_precision_problem(cfg, SHAPE, jnp.float32, return_v_seq)
    if not return_v_seq:
        v_init = None
    (s_c, v_c), g_c = run_vjp("auto", cfg, return_v_seq, x, v_init, w, ct_s, ct_v)
    (s_r, v_r), g_r = run_vjp(REFERENCE, cfg, return_v_seq, x, v_init, w, ct_s, ct_v)
    # Loose: in float32 a 1-ulp difference could flip a spike, which moves gradients locally.
    assert float(jnp.mean(s_c != s_r)) <= 1e-3
    assert v_c.dtype == v_r.dtype == jnp.float32
    assert v_c.shape == (SHAPE if return_v_seq else SHAPE[1:])
    np.testing.assert_allclose(np.asarray(v_c), np.asarray(v_r), rtol=1e-4, atol=1e-4)
    for what, gc, gr in zip(("dx", "dv_init", "dw"), g_c, g_r, strict=True):
        assert (gc is None) == (gr is None), what
        if gr is not None:
            assert gc.dtype == gr.dtype, what
            assert rel_error(gc, gr) < 1e-4, what


def test_single_step_module_dtypes():
    node = M.LIFNode(step_mode="s")
    x = jnp.full((3, 5), 1.5, jnp.bfloat16)
    s = node(x)
    assert s.dtype == jnp.bfloat16 and s.shape == (3, 5)
    assert node.v.get_value().dtype == jnp.float32 and node.v.get_value().shape == (3, 5)
    s, v = F.step(node.config, x, jnp.zeros((3, 5), jnp.float32))
    assert s.dtype == jnp.bfloat16 and v.dtype == jnp.float32


# ---- surrogates -------------------------------------------------------------------

SURROGATES = [
    sg.Sigmoid(), sg.Sigmoid(alpha=1.5), sg.ATan(), sg.ATan(alpha=0.7),
    sg.PiecewiseQuadratic(), sg.PiecewiseQuadratic(alpha=2.5), sg.SoftSign(), sg.SoftSign(alpha=0.8),
    sg.Rect(), sg.Rect(alpha=2.0),
]


def _kinks(s) -> list[float]:
    if isinstance(s, sg.PiecewiseQuadratic):
        return [0.0, 1.0 / s.alpha, -1.0 / s.alpha]
    if isinstance(s, sg.SoftSign):
        return [0.0]
    if isinstance(s, sg.Rect):
        return [0.5 / s.alpha, -0.5 / s.alpha]
    return []


@pytest.mark.parametrize("surrogate", SURROGATES, ids=repr)
def test_surrogate_grad_is_derivative_of_primitive(surrogate):
    x = np.random.default_rng(3).normal(0.0, 1.5, 2000)
    for k in _kinks(surrogate):
        x = x[np.abs(x - k) > 1e-3]
    x = jnp.asarray(x, jnp.float32)
    want = jax.jit(jax.vmap(jax.grad(surrogate.primitive)))(x)
    got = surrogate.grad(x)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)
    assert bool(jnp.all(got >= 0))


@pytest.mark.parametrize("surrogate", SURROGATES, ids=repr)
def test_surrogate_primitive_is_a_smoothed_step(surrogate):
    p = surrogate.primitive(jnp.asarray([-50.0, 0.0, 50.0]))
    np.testing.assert_allclose(np.asarray(p), [0.0, 0.5, 1.0], atol=2e-2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16], ids=["float32", "bfloat16", "float16"])
def test_spike_forward_is_heaviside_with_one_at_zero(dtype):
    tiny = float(jnp.finfo(dtype).tiny)
    x = jnp.asarray([-2.0, -1.0, -tiny, -0.0, 0.0, tiny, 1e-3, 1.0, 3.0], dtype)
    s = sg.spike(x, sg.Sigmoid())
    assert s.dtype == dtype
    np.testing.assert_array_equal(np.asarray(s, np.float32), [0, 0, 0, 1, 1, 1, 1, 1, 1])


@pytest.mark.parametrize("surrogate", SURROGATES, ids=repr)
def test_spike_derivative_is_the_surrogate(surrogate):
    x = jnp.asarray(np.random.default_rng(4).normal(0.0, 1.5, 64), jnp.float32)
    got = jax.grad(lambda x: jnp.sum(sg.spike(x, surrogate)))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(surrogate.grad(x)))


def test_surrogate_by_name():
    assert sg.get("sigmoid") == sg.Sigmoid()
    assert sg.get("atan", 3.0) == sg.ATan(alpha=3.0)
    assert isinstance(sg.get("piecewise_quadratic"), sg.PiecewiseQuadratic)
    assert isinstance(sg.get("soft_sign"), sg.SoftSign)
    assert sg.get("rect", 2.0) == sg.Rect(alpha=2.0) and sg.name_of(sg.Rect()) == "rect"
    hash(sg.get("soft_sign"))  # usable as a jit-static argument
