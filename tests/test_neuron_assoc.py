"""The ``assoc`` path (``snnjax.neurons.kernels.assoc``): a declared linear recurrence by an associative scan.

In float64 it equals the step's ``scan`` path to 1e-12 relative (not bit for bit: the prefix reassociates the
sums) in the outputs, the potentials, and the gradients of x, of the start state and of every learnable
parameter (a per-channel one and a scalar one of a user's neuron); the non-spiking readouts on it match
SpikingJelly's golden cases, decode modes included; it runs under a data x fsdp layout and is refused, with the
reason, where it cannot run.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax.interop import check
from snnjax.neurons import CUBALIFNode, LIFNode, NonSpikingIFNode, NonSpikingLIFNode, set_impl
from snnjax.neurons.kernels import dispatch
from snnjax.parallel import mesh as mesh_lib

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-12
SHAPE = (9, 4, 6)  # [T, N, C]: an odd T, so the scan's levels have a leftover element


def _docs_class():
    """``LearnedLeak`` as docs/neurons.md writes it (the block checked by this file): a user's readout with a
    per-channel and a scalar learned parameter."""
    text = (ROOT / "docs" / "neurons.md").read_text()
    (code,) = re.findall(r'```python title="checked by tests/test_neuron_assoc.py"\n(.*?)```', text, re.S)
    namespace = {}
    exec(compile(code, "docs/neurons.md", "exec"), namespace)
    return namespace["LearnedLeak"]


LearnedLeak = _docs_class()


# (neuron, v_init given, return_v_seq): the readouts' decode modes run in the golden test below
CASES = [("LearnedLeak", True, True), ("LearnedLeak", False, False), ("NonSpikingIFNode", True, True),
         ("NonSpikingLIFNode", False, False)]


def _neurons():
    return {"NonSpikingIFNode": NonSpikingIFNode(), "NonSpikingLIFNode": NonSpikingLIFNode(tau=1.7),
            "LearnedLeak": LearnedLeak(SHAPE[-1], step_mode="m")}


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module, quick_compiles_module):  # conftest: jax_enable_x64, XLA's cheap compiles
    yield


def _inputs():
    k = jax.random.split(jax.random.key(5), 4)
    return (jax.random.normal(k[0], SHAPE, jnp.float64), jax.random.normal(k[1], SHAPE[1:], jnp.float64),
            jax.random.normal(k[2], SHAPE, jnp.float64), jax.random.normal(k[3], SHAPE, jnp.float64))


def _results(impl: str, x, v_init, c_out, c_v):
    """Per neuron and (v_init given, return_v_seq): outputs, v, and the gradients of x, v_init and the params."""
    out = {}
    for name, given, v_seq in CASES:
        neuron, params = _neurons()[name]._step_neuron()

        def loss(x, v_init, params, neuron=neuron, given=given, v_seq=v_seq):
            o, v = dispatch.multistep(neuron, x, v_init if given else None, params, return_v_seq=v_seq, impl=impl)
            return jnp.sum(o * c_out) + jnp.sum(v * (c_v if v_seq else c_v[-1])) ** 2, (o, v)

        (_, ov), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(x, v_init, params)
        out[name, given, v_seq] = (ov, grads if given else grads[::2])
    return out


@pytest.fixture(scope="module")
def both():
    args = _inputs()
    return {impl: jax.device_get(jax.jit(functools.partial(_results, impl))(*args)) for impl in ("scan", "assoc")}


def _close(got, want, label):
    leaves = jax.tree.leaves(want)
    assert leaves and jax.tree.structure(got) == jax.tree.structure(want), label
    for a, b in zip(jax.tree.leaves(got), leaves, strict=True):
        err = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)
        assert err <= TOL, (label, err)


def test_assoc_equals_scan_forward_and_every_gradient(both):
    for key, want in both["scan"].items():
        _close(both["assoc"][key], want, key)
    (_, (_, _, params)) = both["assoc"]["LearnedLeak", True, True]
    assert params["k"].shape == (SHAPE[-1],) and params["g"].shape == ()  # each summed to its own shape
    assert np.all(params["k"][...] != 0) and params["g"][...] != 0


def test_the_readouts_on_assoc_match_spikingjelly():
    """The catalogue's golden cases (``catalogue.npz``): the readouts with their decode modes."""
    cases, arrays = check.load(ROOT / "tests" / "fixtures" / "spikingjelly" / "catalogue.npz")
    readouts = [(c, check.case_arrays(arrays, f"case{i:03d}/")) for i, c in enumerate(cases)
                if c["class"].startswith("NonSpiking")]
    assert {c.get("kwargs", {}).get("decode") for c, _ in readouts} >= {None, "max-abs-mem", "mean-mem"}
    for case, arr in readouts:
        got = check.check_catalogue_case(case, arr, impl="assoc")
        assert got["impl"] == "assoc" and got["ok"], (case, got)


def test_auto_says_why_not_assoc_and_explicit_assoc_refuses_what_it_cannot_run():
    x = jnp.ones((4, 3))
    readout = NonSpikingLIFNode().neuron
    choice = dispatch.choose_impl("auto", readout, x)
    assert choice.impl != "assoc" and dispatch.ASSOC_NOT_AUTO in choice.why
    assert dispatch.ASSOC_NOT_AUTO not in dispatch.choose_impl("auto", CUBALIFNode().neuron, x).why
    assert dispatch.choose_impl("assoc", readout, x) == dispatch.Choice("assoc", "impl='assoc' was asked for")
    with pytest.raises(ValueError, match="CUBALIFNode declares no linear recurrence"):
        dispatch.multistep(CUBALIFNode().neuron, x, impl="assoc")
    with pytest.raises(ValueError, match="LIF fires and resets"):
        LIFNode(step_mode="m", impl="assoc")(x)

    class Charged(NonSpikingLIFNode):  # a subclass that changes the charge is not taken to be linear
        def neuronal_charge(self, x, v, params):
            return v + x

    assert NonSpikingLIFNode().declares_linear() and not Charged().declares_linear()
    with pytest.raises(ValueError, match="Charged declares no linear recurrence"):
        Charged(impl="assoc")(x)

    class Wrong(LearnedLeak):
        def linear_recurrence(self, params):
            return jnp.ones(5), 1.0

    with pytest.raises(ValueError, match=r"Wrong.linear_recurrence returns a of shape \(5,\)"):
        Wrong(3, step_mode="m", impl="assoc")(x)

    model = nnx.Sequential(LIFNode(step_mode="m"), CUBALIFNode(step_mode="m"), NonSpikingIFNode())
    assert set_impl(model, "assoc") == 1
    assert [m.impl for m in model.layers] == ["auto", "auto", "assoc"]


def test_assoc_under_a_data_fsdp_layout_and_refused_where_time_is_split():
    x, v_init, c_out, _ = _inputs()
    node = LearnedLeak(SHAPE[-1], step_mode="m")
    neuron, params = node._step_neuron()

    def grads(impl, x, v_init, params):
        def loss(x, v_init, params):
            o, v = dispatch.multistep(neuron, x, v_init, params, impl=impl)
            return jnp.sum(o * c_out) + jnp.sum(v ** 2)
        return jax.grad(loss, (0, 1, 2))(x, v_init, params)

    want = jax.jit(functools.partial(grads, "scan"))(x, v_init, params)
    mesh = jax.make_mesh((2, 2), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    batch = ("data", "fsdp")
    placed = (jax.device_put(x, NamedSharding(mesh, P(None, batch))),
              jax.device_put(v_init, NamedSharding(mesh, P(batch))), params)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        assert dispatch.resolve_impl("assoc", neuron, x) == "assoc"
        compiled = jax.jit(functools.partial(grads, "assoc")).lower(*placed).compile()
    got = compiled(*placed)
    _close(got, want, "data x fsdp")
    assert got[0].sharding.spec[1] == batch  # dX stays split over the batch
    assert "all-gather" not in compiled.as_text()

    with jax.set_mesh(mesh_lib.make_mesh("time=3", jax.devices()[:3])):
        with pytest.raises(ValueError, match="the mesh splits time"):
            dispatch.choose_impl("assoc", neuron, x)
