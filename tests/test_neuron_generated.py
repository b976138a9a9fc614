"""Neurons given by their single step through the kernels generated from the step, in float64: the native CPU
kernel (C++ from the traced step and its VJP) and the Pallas kernels (the step traced into the kernel, interpreted
on the CPU), against the ``scan`` path and, for IF / LIF / PLIF written as steps, the hand-written kernels."""
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import AdaptiveLIF

from snnjax import neurons
from snnjax.neurons import BaseNode, IzhikevichNode
from snnjax.neurons import base as B
from snnjax.neurons import surrogate as sg
from snnjax.neurons.compare import run_vjp
from snnjax.neurons.kernels import pallas as P
from snnjax.neurons.kernels.native import step as native_step
from snnjax.neurons.kernels.pallas import step as pallas_step

pytestmark = pytest.mark.usefixtures("x64_module")
OPTS = P.KernelOptions(time_chunk=2)  # T = 3 in the Pallas test: a checkpoint, a partial last chunk


def native_generated(cfg, x, v_init, w, *, return_v_seq):
    """IF / LIF / PLIF written as a step (``base.as_step_neuron``) through the generated native kernel."""
    return native_step.multistep(B.as_step_neuron(cfg, w), x, v_init, B.step_params(cfg, w), return_v_seq=return_v_seq)


def pallas_generated(cfg, x, v_init, w, *, return_v_seq):
    return pallas_step.multistep(B.as_step_neuron(cfg, w), x, v_init, B.step_params(cfg, w),
                                 return_v_seq=return_v_seq, options=OPTS)


def problem(seed, shape=(5, 2, 3)):
    rng = np.random.default_rng(seed)
    x, ct_s, ct_v = (jnp.asarray(rng.normal(0.6, 1.2, shape)) for _ in range(3))
    return x, jnp.asarray(rng.normal(0, 0.3, shape[1:])), ct_s, ct_v


def assert_same_forward_close_gradients(got, want):
    """Spikes and V the same bits; every gradient within rounding (the backward formulas round apart)."""
    (s, v), grads = got
    (s_w, v_w), grads_w = want
    assert 0 < float(jnp.mean(s)) < 1
    np.testing.assert_array_equal(s, s_w)
    np.testing.assert_array_equal(v, v_w)
    for g, g_w in zip(grads, grads_w, strict=True):
        assert (g is None) == (g_w is None)
        if g is not None:
            np.testing.assert_allclose(g, g_w, rtol=1e-12, atol=1e-14)


def test_builtins_written_as_steps_equal_the_hand_written_native_kernels():
    """IF and PLIF (a learned parameter), with and without V's sequence: the native kernel generated from
    ``charge`` / ``fire`` / ``reset`` gives the hand-written kernel's spikes and V bit for bit (LIF over hard and soft
    reset, detach on and off: the docs' user LIF in ``test_neuron_catalogue.py``)."""
    x, v_init, ct_s, ct_v = problem(1)
    cases = [(neurons.NeuronConfig(kind="IF", detach_reset=True), False),
             (neurons.NeuronConfig(kind="PLIF", v_reset=-0.3, decay_input=False, detach_reset=True,
                                   surrogate=sg.PiecewiseQuadratic()), True)]
    for cfg, seq in cases:
        w = jnp.asarray(0.3) if cfg.kind == "PLIF" else None
        args = (cfg, seq, x, v_init, w, ct_s, ct_v if seq else ct_v[0])
        assert_same_forward_close_gradients(run_vjp(native_generated, *args), run_vjp("native", *args))


def test_the_pallas_kernels_of_a_step_equal_the_hand_written_ones_and_scan():
    """Interpreted: PLIF as a step against the hand-written Pallas kernels (spikes and V bitwise), and a user's
    adaptive LIF (two state variables, a learned parameter, a given start state) against ``scan``."""
    x, v_init, ct_s, ct_v = problem(2, (3, 2, 3))
    cfg = neurons.NeuronConfig(kind="PLIF", v_reset=None)
    args = (cfg, True, x, v_init, jnp.asarray(0.3), ct_s, ct_v)
    hand = functools.partial(P.multistep, options=OPTS)
    assert_same_forward_close_gradients(run_vjp(pallas_generated, *args), run_vjp(hand, *args))
    got, want = (user_vjp(AdaptiveLIF, impl, x, v_init, ct_s) for impl in ("pallas", "scan"))
    assert_same_forward_close_gradients(got, want)


def user_vjp(cls, impl, x, v_init, ct_s, **kw):
    """``((outputs, final state leaves), (dx, d_state0 leaves, d_params leaves))`` of a user neuron on ``impl``."""
    node = cls(step_mode="m", impl=impl, **kw)
    graphdef, params, rest = nnx.split(node, nnx.Param, ...)
    state0 = {"v": v_init, **({"th": 1.0 + 0.1 * v_init} if cls is AdaptiveLIF else {"w": 0.5 * v_init})}

    def run(x, state0, params):
        s, final = nnx.merge(graphdef, params, rest).multi_step(x, state0)
        return s, final

    (s, final), vjp = jax.vjp(run, x, state0, params)
    ct_final = jax.tree.map(lambda a: jnp.cos(a) * 0.5, final)
    dx, d0, dp = vjp((ct_s, ct_final))
    return (s, jax.tree.leaves(final)), (dx, *jax.tree.leaves(d0), *jax.tree.leaves(dp))


@pytest.mark.parametrize("cls", [AdaptiveLIF, IzhikevichNode])
def test_user_neurons_through_the_generated_native_kernel_match_scan(cls):
    """Several state variables (a start state for each, the final state's cotangents), learned parameters."""
    x, v_init, ct_s, _ = problem(3, (7, 2, 3))
    kw = {"a": 0.3, "b": 0.2} if cls is IzhikevichNode else {}
    got, want = (user_vjp(cls, impl, x, v_init, ct_s, **kw) for impl in ("native", "scan"))
    (s, final), grads = got
    (s_w, final_w), grads_w = want
    np.testing.assert_array_equal(s, s_w)
    for a, b in zip((*final, *grads), (*final_w, *grads_w), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


class MeanField(BaseNode):
    """A step that is not elementwise over the neurons (it reads their mean): no generated kernel runs it."""

    def neuronal_charge(self, x, v, params):
        return v + x - jnp.mean(v)


def test_auto_runs_the_generated_kernel_and_says_which_path_it_chose():
    x = jnp.asarray(np.random.default_rng(4).normal(0.5, 1.0, (4, 2, 3)))
    choice = neurons.choose_impl("auto", AdaptiveLIF().neuron, x)
    assert choice.impl == "native" and "generated from AdaptiveLIF's step" in choice.why
    assert neurons.choose_impl("auto", AdaptiveLIF().neuron, x[:1]).impl == "scan"  # T = 1: nothing to fuse
    node = MeanField(step_mode="m")
    with pytest.warns(UserWarning, match=r"with the scan path: the native kernels cannot run it: .*'reduce_sum'"):
        out = node(x)
    node.impl = "scan"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(out, node(x))
    with pytest.raises(ValueError, match="impl='native' cannot run .* use impl='scan'"):
        MeanField(step_mode="m", impl="native")(x)
