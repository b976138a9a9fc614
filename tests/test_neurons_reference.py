"""IF / LIF / PLIF modules against SpikingJelly 2.0.0 golden data (``tests/fixtures/spikingjelly/neurons.*``).

Every case of ``neurons.json`` (in float64) runs through
- the Flax NNX modules in multi-step mode (``store_v_seq=True``, PLIF's ``w`` from the file),
- the modules in single-step mode, fed one time step at a time, then ``reset_net``.
Spikes must match exactly; ``v_seq``, ``grad_x`` and PLIF's ``grad_w`` to 1e-10 normwise
relative error. The cases are read generically (any T, trailing shape, case list; missing
keys take SpikingJelly's defaults); every implementation of the multi-step neuron is held to
the same data in ``test_neuron_impls.py``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from neuron_checks import assert_matches_reference

from snnjax.interop import check
from snnjax.neurons import modules as M

pytestmark = pytest.mark.usefixtures("x64_module")


def _node(case: dict, arrays: dict, step_mode: str, store_v_seq: bool = False) -> M.BaseNode:
    cfg = check.neuron_config(case)
    kw = dict(v_threshold=cfg.v_threshold, v_reset=cfg.v_reset, detach_reset=cfg.detach_reset,
              surrogate_function=cfg.surrogate, step_mode=step_mode, store_v_seq=store_v_seq)
    if cfg.kind == "IF":
        return M.IFNode(**kw)
    if cfg.kind == "LIF":
        return M.LIFNode(tau=cfg.tau, decay_input=cfg.decay_input, **kw)
    node = M.ParametricLIFNode(init_tau=float(case.get("init_tau", 2.0)), decay_input=cfg.decay_input, **kw)
    node.w.set_value(jnp.asarray(check.plif_w(case, arrays), jnp.float64))
    return node


def test_reference_has_cases(neuron_reference):
    cases, _ = neuron_reference
    assert len(cases) > 0, "neurons.json lists no cases"
    kinds = {d["kind"] for d in cases}
    assert kinds <= {"IF", "LIF", "PLIF"}, kinds


def test_module_multistep_matches_spikingjelly(neuron_case):
    """The NNX module path (config assembly, w parameter, sown v_seq, gradients).

    Runs op by op under ``jax.disable_jit`` (fast: no per-case compilation); the compiled
    implementations are held to the same data in ``test_neuron_impls.py``.
    """
    case, a = neuron_case
    node = _node(case, a, step_mode="m", store_v_seq=True)
    assert node.config == check.neuron_config(case)
    gs = jnp.asarray(a["grad_spikes"])

    def loss(m, x):
        s, inter = nnx.capture(m, nnx.Intermediate)(x)
        return jnp.sum(s * gs), (s, inter["v_seq"].get_value())

    with jax.disable_jit():
        (_, (s, v_seq)), (g_state, gx) = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
            node, jnp.asarray(a["x"]))
    plif = {"grad_w": g_state["w"].get_value()} if case["kind"] == "PLIF" and "grad_w" in a else {}
    assert_matches_reference(a, s, v_seq=v_seq, grad_x=gx, **plif)


def test_module_single_step_matches_spikingjelly(neuron_case):
    case, a = neuron_case
    node = _node(case, a, step_mode="s")
    fresh = np.asarray(node.v.get_value())

    def run():
        spikes, vs = [], []
        for t in range(a["x"].shape[0]):
            spikes.append(np.asarray(node(jnp.asarray(a["x"][t]))))
            vs.append(np.asarray(node.v.get_value()))
        return np.stack(spikes), np.stack(vs)

    s1, v1 = run()
    M.reset_net(node)
    v_after = np.asarray(node.v.get_value())
    assert v_after.dtype == fresh.dtype and v_after.shape == fresh.shape
    np.testing.assert_array_equal(v_after, fresh, err_msg="reset_net did not restore the initial state")
    s2, v2 = run()
    np.testing.assert_array_equal(s2, s1, err_msg="a second run after reset_net differs from the first")
    np.testing.assert_array_equal(v2, v1, err_msg="a second run after reset_net differs from the first")

    assert_matches_reference(a, s1, v_seq=v1)


def test_reset_net_resets_every_neuron_in_a_model():
    class Net(nnx.Module):
        def __init__(self):
            self.a = M.IFNode(v_reset=-0.5)
            self.b = M.LIFNode(v_reset=None)
            self.c = M.ParametricLIFNode()

    net = Net()
    fresh = {n: np.asarray(getattr(net, n).v.get_value()) for n in "abc"}
    x = jnp.full((4,), 0.7)
    for _ in range(3):
        net.a(x), net.b(x), net.c(x)
    assert any(not np.array_equal(np.asarray(getattr(net, n).v.get_value()), fresh[n]) for n in "abc")
    M.reset_net(net)
    for n in "abc":
        np.testing.assert_array_equal(np.asarray(getattr(net, n).v.get_value()), fresh[n], err_msg=n)
    assert float(net.a.v.get_value()) == np.float32(-0.5) and float(net.b.v.get_value()) == 0.0


def test_plif_initial_w():
    node = M.ParametricLIFNode(init_tau=3.0)
    np.testing.assert_allclose(float(node.w.get_value()), -math.log(2.0), rtol=1e-6)
    # 1/tau = sigmoid(w) recovers init_tau
    np.testing.assert_allclose(1.0 / float(jax.nn.sigmoid(node.w.get_value())), 3.0, rtol=1e-6)
