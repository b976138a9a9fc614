"""The fused kernels under sharded layouts (8 host devices): the partitioner runs them per shard, with no gather.

For each layout (batch over data; channels over tensor; data x tensor; rows over tensor as under
sequence parallelism; batch over data x fsdp with channels over tensor) one jitted function runs
every neuron variant below through ``snnjax.neurons.multistep`` under the layout's mesh context,
forward and backward; it must give the spikes of the unsharded XLA path exactly and its states and
gradients (x, v_init, PLIF's w) to 1e-12 relative (float64), and its compiled HLO must run the
kernels on each device's block (``[T, M / devices]``) with no all-gather (nor all-to-all or
collective-permute) anywhere.
"""
from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import suite_cases
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax.neurons import surrogate as sg
from snnjax.neurons.base import NeuronConfig
from snnjax.neurons.kernels import dispatch

TOL = 1e-12
SHAPE = (3, 8, 4, 2, 8)  # [T, N, H, W, C]: M = 512 neurons, 64 per device
LAYOUTS = {  # name: (mesh axis sizes, sharding of x)
    "dp": ({"data": 8}, P(None, "data")),
    "tp": ({"tensor": 8}, P(None, None, None, None, "tensor")),
    "dp_tp": ({"data": 4, "tensor": 2}, P(None, "data", None, None, "tensor")),
    "dp_sp": ({"data": 4, "tensor": 2}, P(None, "data", "tensor")),  # rows (a middle dim) over tensor
    "fsdp_tp": ({"data": 2, "fsdp": 2, "tensor": 2}, P(None, ("data", "fsdp"), None, None, "tensor")),
}
VARIANTS = [
    NeuronConfig("IF"),
    NeuronConfig("IF", v_reset=None, detach_reset=True),
    NeuronConfig("LIF", tau=2.5),
    NeuronConfig("LIF", decay_input=False, v_reset=-0.2, surrogate=sg.ATan()),
    NeuronConfig("LIF", decay_input=False, v_reset=None, detach_reset=True),
    NeuronConfig("PLIF"),
    NeuronConfig("PLIF", decay_input=False, v_reset=None),
    NeuronConfig("PLIF", v_reset=-0.1, detach_reset=True, surrogate=sg.ATan()),
]
# (v_init given, return_v_seq, outputs the loss uses): "s" leaves V's cotangent a symbolic zero, "v" the spikes'.
COMBOS = [(False, False, "s"), (True, True, "sv"), (True, False, "sv"), (False, True, "v")]
# every variant with two combos, every combo with four variants (two per kind at least)
CASES = [(cfg, *COMBOS[(i + j) % 4]) for i, cfg in enumerate(VARIANTS) for j in (0, 2)]
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute")


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module):  # conftest: jax_enable_x64 for this module
    yield
    _reference.cache_clear()


def _mesh(sizes: dict[str, int]):
    names = tuple(sizes)
    return jax.make_mesh(tuple(sizes.values()), names, axis_types=(AxisType.Auto,) * len(names))


def _inputs(shape=SHAPE):
    k = jax.random.split(jax.random.key(3), 4)
    x = jax.random.normal(k[0], shape, jnp.float64) * 0.8 + 0.35
    v_init = jax.random.normal(k[1], shape[1:], jnp.float64) * 0.3
    return x, v_init, jnp.asarray(-0.4, jnp.float64), jax.random.normal(k[2], shape, jnp.float64), \
        jax.random.normal(k[3], shape, jnp.float64)


def _all_cases(impl: str, cases, x, v_init, w, cs, cv):
    """Spikes, states and gradients (x, v_init, w) of every case, through ``dispatch.multistep(impl=impl)``."""
    out = []
    for cfg, given, v_seq, uses in cases:
        def loss(x, v_init, w, cfg=cfg, given=given, v_seq=v_seq, uses=uses):
            s, v = dispatch.multistep(cfg, x, v_init if given else None, w if cfg.kind == "PLIF" else None,
                                      return_v_seq=v_seq, impl=impl)
            value = (jnp.sum(s * cs) if "s" in uses else 0.0) + (jnp.sum(v * (cv if v_seq else cv[0])) if "v" in uses
                                                                 else 0.0)
            return value, (s, v)

        (_, (s, v)), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, v_init, w)
        out.append((s, v, *grads))
    return out


@functools.cache
def _reference(cases_key: str):
    cases = CASES if cases_key == "all" else PALLAS_CASES
    return jax.device_get(jax.jit(functools.partial(_all_cases, "xla", cases))(*_inputs()))


def _run_sharded(impl: str, layout: str, cases):
    """``(results, compiled HLO text)`` of every case under ``layout``."""
    sizes, spec = LAYOUTS[layout]
    mesh = _mesh(sizes)
    x, v_init, w, cs, cv = _inputs()
    trailing = NamedSharding(mesh, P(*tuple(spec)[1:]))
    args = (jax.device_put(x, NamedSharding(mesh, spec)), jax.device_put(v_init, trailing),
            jax.device_put(w, NamedSharding(mesh, P())), jax.device_put(cs, NamedSharding(mesh, spec)),
            jax.device_put(cv, NamedSharding(mesh, spec)))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        fn = jax.jit(functools.partial(_all_cases, impl, cases))
        compiled = fn.lower(*args).compile()
    return jax.device_get(compiled(*args)), compiled.as_text()


def _check_equal(results, reference, cases):
    for (cfg, given, v_seq, uses), got, ref in zip(cases, results, reference, strict=True):
        s, v, dx, dv_init, dw = got
        rs, rv, rdx, rdv_init, rdw = ref
        label = (cfg, given, v_seq, uses)
        np.testing.assert_array_equal(s, rs, err_msg=str(label))
        pairs = [(v, rv), (dx, rdx)] + ([(dv_init, rdv_init)] if given else []) + \
                ([(dw, rdw)] if cfg.kind == "PLIF" else [])
        for a, b in pairs:
            err = np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300)
            assert err <= TOL, (label, err)
        assert np.any(rs) and not np.all(rs), label  # the inputs make some neurons fire and some not


def _check_hlo(text: str, per_device: str, whole: str):
    for name in COLLECTIVES:
        assert f" {name}(" not in text and f" {name}-start(" not in text, name
    assert per_device in text and whole not in text  # [T, M] exists only per device


@pytest.mark.parametrize("layout", suite_cases(list(LAYOUTS), ["dp", "dp_tp", "fsdp_tp"]))  # pallas: dp_sp too
def test_native_sharded_matches_xla_and_gathers_nothing(layout):
    results, text = _run_sharded("native", layout, CASES)
    _check_equal(results, _reference("all"), CASES)
    targets = set(re.findall(r'custom_call_target="(\w+)"', text))
    assert {"SnnNeuronForwardF64", "SnnNeuronBackwardF64"} <= targets, targets
    calls = [ln for ln in text.splitlines() if "SnnNeuron" in ln and "custom-call(" in ln]
    assert calls and all("f64[3,64]" in ln for ln in calls), calls  # each device's 64 neurons
    _check_hlo(text, "f64[3,64]", "f64[3,512]")
    assert text.count(" all-reduce(") + text.count(" all-reduce-start(") >= 1  # PLIF's dw summed over devices


PALLAS_CASES = [CASES[1], CASES[4], CASES[11], CASES[13]]  # IF, LIF, PLIF x v_init / return_v_seq / uses


@pytest.mark.parametrize("layout", ["dp_tp", "dp_sp"])
def test_pallas_sharded_matches_xla_and_gathers_nothing(layout):
    results, text = _run_sharded("pallas", layout, PALLAS_CASES)  # interpret mode on the CPU
    _check_equal(results, _reference("pallas"), PALLAS_CASES)
    _check_hlo(text, "f64[3,64]", "f64[3,512]")


def test_auto_runs_the_native_kernels_per_shard_under_a_layout():
    cfg = NeuronConfig("PLIF")
    mesh = _mesh({"data": 8})
    x, _, w, cs, _ = _inputs()
    xs = jax.device_put(x, NamedSharding(mesh, P(None, "data")))

    def f(x, w, impl="auto"):
        def loss(x, w):
            s, _ = dispatch.multistep(cfg, x, None, w, impl=impl)
            return jnp.sum(s * cs), s

        return jax.grad(loss, argnums=(0, 1), has_aux=True)(x, w)

    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        compiled = jax.jit(f).lower(xs, w).compile()
    text = compiled.as_text()
    assert "SnnNeuronForwardF64" in text and "SnnNeuronBackwardF64" in text
    _check_hlo(text, "f64[3,64]", "f64[3,512]")
    (dx, dw), s = compiled(xs, w)
    (rdx, rdw), rs = jax.jit(functools.partial(f, impl="xla"))(x, w)
    np.testing.assert_array_equal(s, rs)
    for a, b in ((dx, rdx), (dw, rdw)):
        assert np.max(np.abs(a - b)) <= TOL * np.max(np.abs(b))


def test_a_dim_that_does_not_divide_is_kept_whole():
    """Channels of 6 constrained over tensor=4 (padded shards): the wrapper keeps them whole; dw stays exact."""
    cfg = NeuronConfig("PLIF", v_reset=None)
    mesh = _mesh({"data": 2, "tensor": 4})
    x, _, w, cs, _ = _inputs((3, 4, 2, 6))

    def f(x, w, impl):
        if impl != "xla":
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, "data", None, "tensor")))
        return jax.grad(lambda x, w: jnp.sum(dispatch.multistep(cfg, x, None, w, impl=impl)[0] * cs),
                        argnums=(0, 1))(x, w)

    xs = jax.device_put(x, NamedSharding(mesh, P(None, "data")))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        got = jax.jit(functools.partial(f, impl="native"))(xs, w)
    ref = jax.jit(functools.partial(f, impl="xla"))(x, w)
    for a, b in zip(got, ref, strict=True):
        assert np.max(np.abs(a - b)) <= TOL * np.max(np.abs(b))


def test_auto_picks_the_fused_kernels_under_a_layout(monkeypatch):
    """Replaces test_native.py's and test_pallas.py's ``test_auto_is_*_and_xla_under_a_layout``."""
    cfg = NeuronConfig()
    x, one_step = jnp.ones((3, 4), jnp.float32), jnp.ones((1, 4), jnp.float32)
    assert jax.default_backend() == "cpu"
    mesh = _mesh({"data": 8})
    for context in (jax.sharding.use_abstract_mesh(mesh.abstract_mesh), jax.set_mesh(mesh)):
        with context:
            assert dispatch.mesh_is_partitioned()
            assert dispatch.resolve_impl("auto", cfg, x) == "native"
            assert dispatch.resolve_impl("auto", cfg, one_step) == "xla"  # T = 1: nothing to fuse
            assert dispatch.resolve_impl("pallas", cfg, x) == "pallas"  # an explicit choice is kept
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        assert dispatch.resolve_impl("auto", cfg, x) == dispatch.resolve_impl("auto", cfg, x.astype(jnp.bfloat16))
        assert dispatch.resolve_impl("auto", cfg, x) == "pallas"
    assert dispatch.resolve_impl("auto", cfg, x) == "pallas"


def test_auto_runs_the_kernels_in_a_shard_map_that_leaves_axes_automatic():
    cfg = NeuronConfig()
    mesh = _mesh({"stage": 2, "data": 4})
    seen = []

    def body(x):
        seen.append(dispatch.resolve_impl("auto", cfg, x[0]))
        return x

    with jax.set_mesh(mesh):
        jax.jit(jax.shard_map(body, in_specs=P("stage"), out_specs=P("stage"), axis_names={"stage"}))(
            jnp.ones((2, 3, 8)))
        jax.jit(jax.shard_map(body, in_specs=P("stage"), out_specs=P("stage")))(jnp.ones((2, 3, 8)))
    assert seen == ["native", "native"]


@pytest.mark.parametrize("spec", [P(None, "data", None, None, "tensor"), P(None, "data"), P(None, ("data", "tensor"))])
def test_native_per_block_inside_a_shard_map_over_another_axis(spec):
    """Inside a ``shard_map`` manual over ``stage`` (a pipeline stage), with data x tensor left to the partitioner:
    each device's kernel call gets its own block (the partitioner's unnamed tiling, read off by ``sharded``), PLIF's
    ``dw`` adds up over the blocks, and everything equals the unsharded ``xla`` path."""
    mesh = _mesh({"stage": 2, "data": 2, "tensor": 2})
    cfg = NeuronConfig("PLIF", v_reset=None)
    x = 1.5 * jax.random.normal(jax.random.key(0), (2, *SHAPE), jnp.float64)
    w = jnp.asarray(0.3, jnp.float64)

    def loss(impl, x, w):
        s, v = dispatch.multistep(cfg, x, None, w, impl=impl)
        return jnp.sum(s * jnp.cos(jnp.arange(s.size).reshape(s.shape))) + jnp.sum(v ** 2), s

    def body(x, w):
        x = jax.lax.with_sharding_constraint(x[0], NamedSharding(mesh.abstract_mesh, spec))
        (_, s), (gx, gw) = jax.value_and_grad(functools.partial(loss, "native"), (0, 1), has_aux=True)(x, w)
        return s[None], gx[None], gw[None]

    with jax.set_mesh(mesh):
        placed = jax.device_put(x, NamedSharding(mesh, P("stage")))
        fn = jax.jit(jax.shard_map(body, in_specs=(P("stage"), P()), out_specs=P("stage"), axis_names={"stage"},
                                   check_vma=False))
        s, gx, gw = fn(placed, w)
        text = fn.lower(placed, w).compile().as_text()
    for i in range(2):
        (_, rs), (rgx, rgw) = jax.value_and_grad(functools.partial(loss, "xla"), (0, 1), has_aux=True)(x[i], w)
        np.testing.assert_array_equal(s[i], rs)
        assert np.max(np.abs(gx[i] - rgx)) <= TOL * np.max(np.abs(rgx))
        assert abs(gw[i] - rgw) <= TOL * abs(rgw)
    sizes = {int(m) for m in re.findall(r'custom-call\(.*custom_call_target="SnnNeuron\w+", '
                                        r'operand_layout_constraints=\{f64\[\d+,(\d+)\]', text)}
    shards = 4 if spec == P(None, ("data", "tensor")) or len(spec) == 5 else 2
    assert sizes == {np.prod(SHAPE[1:]) // shards}, sizes
