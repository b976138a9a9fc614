"""Neurons given by their single step under layouts (8 host devices, float64): the kernels generated from the step
run per shard under data x fsdp x tensor and per time block under time x data, and equal one device's ``scan``
path (outputs, final state, gradients of the input, the start state and the learned parameter) to 1e-12; the
plan says which path runs each neuron and why."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import COMPILER_OPTIONS, AdaptiveLIF, neuron_kernels
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax import parallel
from snnjax.neurons import IzhikevichNode
from snnjax.neurons.kernels import dispatch, temporal
from snnjax.neurons.kernels import pallas as pallas_kernels
from snnjax.parallel import mesh as mesh_lib

pytestmark = pytest.mark.usefixtures("x64_module")
TOL = 1e-12
SHAPE = (8, 8, 4, 16)  # [T, N, H, C]: 512 neurons
LAYOUTS = {  # name: (mesh, sharding of x, neurons per kernel call on one device)
    "fsdp_tp": ("data=2,fsdp=2,tensor=2", P(None, ("data", "fsdp"), None, "tensor"), 2 * 4 * 8),
    "time": ("time=4,data=2", P("time", "data"), 4 * 4 * 16),
    "time_only": ("time=4", P("time"), 8 * 4 * 16),  # no other axis: the kernel on the whole block, unpartitioned
}
NEURONS = ((AdaptiveLIF, {}), (IzhikevichNode, {"a": 0.3, "b": 0.2}))


def _inputs():
    k = jax.random.split(jax.random.key(5), 3)
    return (jax.random.normal(k[0], SHAPE, jnp.float64) * 0.8 + 0.5,
            jax.random.normal(k[1], SHAPE[1:], jnp.float64) * 0.3, jax.random.normal(k[2], SHAPE, jnp.float64))


def _run(impl, neurons, x, v0, cs):
    """Per neuron: ``(outputs, final state leaves, dx, d(start state) leaves, d(params) leaves)``. AdaptiveLIF starts
    from a given state (both variables), IzhikevichNode from the fresh one (the kernels' shared scalar start)."""
    results = []
    for cls, kw in neurons:
        graphdef, params, rest = nnx.split(cls(step_mode="m", impl=impl, **kw), nnx.Param, ...)
        state0 = {"v": v0, "th": 1.0 + 0.1 * v0} if cls is AdaptiveLIF else {}

        def loss(x, state0, params, graphdef=graphdef, rest=rest):
            s, final = nnx.merge(graphdef, params, rest).multi_step(x, state0 or None)
            return jnp.sum(s * cs) + sum(jnp.sum(jnp.cos(a)) for a in jax.tree.leaves(final)), (s, final)

        (_, (s, final)), (dx, d0, dp) = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, state0, params)
        results.append((s, jax.tree.leaves(final), dx, jax.tree.leaves(d0), jax.tree.leaves(dp)))
    return results


@functools.cache
def _reference():
    inputs = _inputs()
    return jax.device_get(jax.jit(functools.partial(_run, "scan", NEURONS)).lower(*inputs).compile(COMPILER_OPTIONS)(
        *inputs))


def _under_layout(layout, impl, neurons=NEURONS):
    """``(results, choices of auto and impl for AdaptiveLIF, compiled HLO)`` of ``neurons`` on ``impl`` under
    ``layout``, its mesh's devices given as a plan's layout gives them."""
    spec, sharding, _ = LAYOUTS[layout]
    mesh = mesh_lib.make_mesh(spec, jax.devices()[:4 if layout == "time_only" else 8])
    x, v0, cs = _inputs()
    args = (jax.device_put(x, NamedSharding(mesh, sharding)),
            jax.device_put(v0, NamedSharding(mesh, P(*tuple(sharding)[1:]))),
            jax.device_put(cs, NamedSharding(mesh, sharding)))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), temporal.devices(mesh):
        choices = [dispatch.choose_impl(i, AdaptiveLIF().neuron, args[0]) for i in ("auto", impl)]
        compiled = jax.jit(functools.partial(_run, impl, neurons)).lower(*args).compile(COMPILER_OPTIONS)
    return jax.device_get(compiled(*args)), choices, compiled.as_text()


def _assert_equal(results, reference):
    for got, want in zip(results, reference, strict=True):
        np.testing.assert_array_equal(got[0], want[0])
        assert 0 < float(np.mean(got[0])) < 1
        for a, b in zip(jax.tree.leaves(got[1:]), jax.tree.leaves(want[1:]), strict=True):
            assert a.shape == b.shape
            err = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)
            assert err <= TOL, err


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_generated_native_kernel_runs_per_shard_and_per_time_block(layout):
    """``auto`` picks the generated kernel under data x fsdp x tensor (each call on a device's 64 neurons) and says
    so; under the time split it keeps ``scan`` per block (the measured policy) and an explicit ``native`` runs the
    kernel on each device's share of a block (on the whole block where time is the only axis), the state dict
    passed between the time devices."""
    impl = "auto" if layout == "fsdp_tp" else "native"
    neurons = NEURONS[:1] if layout == "time_only" else NEURONS
    results, (auto, chosen), hlo = _under_layout(layout, impl, neurons)
    _assert_equal(results, _reference()[:len(neurons)])
    calls = neuron_kernels(hlo)
    local = LAYOUTS[layout][2]
    assert set(calls) == {"SnnStepForwardF64", "SnnStepBackwardF64"}
    assert {m for ms in calls.values() for m in ms} == {local}
    if layout == "fsdp_tp":
        assert auto.impl == "native" and "generated from AdaptiveLIF's step" in auto.why
        assert "each device's shard of the neurons" in auto.why
    else:
        assert auto.impl == "scan" and "under the time split the scan path computes each block" in auto.why
        assert chosen.impl == "native" and "T is split over the mesh axis time" in chosen.why


def test_the_generated_pallas_kernels_run_per_shard():
    """Interpreted on the CPU: AdaptiveLIF's Pallas kernels per shard of data x fsdp x tensor."""
    results, (_, chosen), hlo = _under_layout("fsdp_tp", "pallas", NEURONS[:1])
    _assert_equal(results, _reference()[:1])
    assert chosen.impl == "pallas" and "each device's shard of the neurons" in chosen.why
    assert not neuron_kernels(hlo) and "all-gather" not in hlo
    assert pallas_kernels.unsupported_reason(AdaptiveLIF().neuron, SHAPE, jnp.float64) is None


class TwoNeurons(nnx.Module):
    def __init__(self):
        self.fc = nnx.Linear(16, 16, rngs=nnx.Rngs(0), param_dtype=jnp.float64)
        self.adaptive = AdaptiveLIF(step_mode="m")
        self.izhikevich = IzhikevichNode(step_mode="m")

    def __call__(self, x):
        return self.izhikevich(self.adaptive(self.fc(x)))


def test_the_plan_says_which_path_runs_each_neuron_and_why():
    model = TwoNeurons()
    plan = functools.partial(parallel.plan, model, input_shape=(8, 8, 16), compute_dtype=jnp.float64)
    text = str(plan("data=4,fsdp=2"))
    for name in ("AdaptiveLIF", "IzhikevichNode"):
        assert (f"neurons {name} (1 layer): native: the native kernels generated from {name}'s step are the 'cpu' "
                "backend's fused path; under the layout it runs on each device's shard of the neurons") in text
    p = plan("time=4,data=2")
    assert [(r["neuron"], r["impl"]) for r in p.neurons] == [("AdaptiveLIF", "scan"), ("IzhikevichNode", "scan")]
    assert "neurons AdaptiveLIF (1 layer): scan: under the time split the scan path computes each block" in str(p)
    assert parallel.plan(model, "data=8").neurons is None  # no batch shape: nothing traced, nothing said
