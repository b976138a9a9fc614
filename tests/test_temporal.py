"""The time-sharded neuron (``neurons.kernels.temporal``) equals the unsharded one, and its schedule is as stated.

float64 on 8 host devices: spikes identical, states and gradients (x, v_init, PLIF's w) within 1e-12
relative of the ``xla`` path on one device, for every neuron variant, with T split over ``time``
(alone and beside data / tensor), explicit and automatic block counts, each block computed by the
``xla`` path or by the native CPU kernels (where no other mesh axis splits the activations).
"""
from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import native_kernel
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax.neurons import ATan, Sigmoid
from snnjax.neurons import base as B
from snnjax.neurons.kernels import dispatch, temporal, xla
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import report

TOL = 1e-12

VARIANTS = {
    "IF-hard": B.NeuronConfig(kind="IF"),
    "LIF-hard-detach-atan": B.NeuronConfig(kind="LIF", tau=1.5, detach_reset=True, surrogate=ATan()),
    "LIF-soft-nodecay": B.NeuronConfig(kind="LIF", tau=2.0, decay_input=False, v_reset=None),
    "LIF-hard-vr": B.NeuronConfig(kind="LIF", tau=3.0, v_reset=-0.2, v_threshold=0.8),
    "PLIF-hard": B.NeuronConfig(kind="PLIF"),
    "PLIF-soft-detach-nodecay": B.NeuronConfig(kind="PLIF", v_reset=None, detach_reset=True, decay_input=False,
                                               surrogate=Sigmoid(alpha=2.0)),
}


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module):
    yield


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _inputs(shape, cfg):
    x = jax.random.normal(jax.random.key(0), shape, jnp.float64) * 0.9 + 0.4
    v0 = jax.random.normal(jax.random.key(1), shape[1:], jnp.float64) * 0.3
    w = jnp.asarray(-0.4, jnp.float64) if cfg.kind == "PLIF" else None
    weights = jax.random.normal(jax.random.key(2), shape, jnp.float64)  # a loss that weighs every spike and state
    return x, v0, w, weights


def _grads(fn, cfg, x, v0, w, weights, *, v_init: bool, seq: bool):
    def loss(x, v0, w):
        s, v = fn(cfg, x, v0 if v_init else None, w, return_v_seq=seq)
        vv = v * weights if seq else v * weights[-1]
        return jnp.sum(s * weights) + jnp.sum(jnp.sin(vv)), (s, v)

    (_, (s, v)), g = jax.value_and_grad(loss, argnums=(0, 1, 2) if w is not None else (0, 1), has_aux=True)(x, v0, w)
    return s, v, g


def _sharded(mesh, cfg, x, v0, w, weights, blocks, kernel=None, **kw):
    def fn(cfg, x, v_init, w, *, return_v_seq):
        return temporal.multistep(cfg, x, v_init, w, return_v_seq=return_v_seq, blocks=blocks, kernel=kernel)

    def run(x, v0, w, weights):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return _grads(fn, cfg, x, v0, w, weights, **kw)

    xs = jax.device_put(x, NamedSharding(mesh, P("time", "data", None, "tensor")))
    return jax.jit(run)(xs, v0, w, weights)


def _assert_equal_to_unsharded(cfg, mesh, blocks, v_init, seq, kernel=None, shape=(16, 4, 6, 8)):
    x, v0, w, weights = _inputs(shape, cfg)
    ref = jax.jit(lambda *a: _grads(xla.multistep, cfg, *a, v_init=v_init, seq=seq))(x, v0, w, weights)
    got = _sharded(mesh, cfg, x, v0, w, weights, blocks, kernel, v_init=v_init, seq=seq)
    assert float(jnp.sum(ref[0])) > 0, "no spikes: the case tests nothing"
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(ref[0]))  # spikes identical
    assert _rel(got[1], ref[1]) <= TOL
    names = ("x", "v_init", "w")
    for label, g, r in zip(names, got[2], ref[2], strict=False):
        if label == "v_init" and not v_init:
            continue
        assert _rel(g, r) <= TOL, (label, _rel(g, r))


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("mesh_spec,blocks,v_init,seq", [
    ("time=8", 3, True, False),
    ("time=2,data=2,tensor=2", 0, False, True),
    ("time=4,data=2", 2, True, True),
])
def test_time_sharded_neuron_equals_unsharded(name, mesh_spec, blocks, v_init, seq):
    _assert_equal_to_unsharded(VARIANTS[name], mesh_lib.make_mesh(mesh_spec), blocks, v_init, seq)


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("shards,t,blocks,v_init,seq", [
    (8, 16, 3, True, False),
    (4, 16, 0, False, True),
    (2, 16, 2, True, True),
    (8, 8, 2, False, False),  # one step per device
])
def test_native_kernel_per_block_equals_unsharded(name, shards, t, blocks, v_init, seq):
    mesh = mesh_lib.make_mesh(f"time={shards}", jax.devices()[:shards])
    _assert_equal_to_unsharded(VARIANTS[name], mesh, blocks, v_init, seq, native_kernel(), (t, 4, 6, 8))


@pytest.mark.parametrize("spec,devices,native", [("time=4", False, True), ("time=4,data=2", True, True),
                                                 ("time=4,data=2", False, False)])
def test_the_kernel_runs_per_block_and_device(spec, devices, native):
    """Beside another split axis the pipeline's ``shard_map`` leaves that axis to the partitioner: the kernel then
    runs per device on its share of each block (``custom_partitioning``, which needs the mesh's devices: given by
    ``temporal.devices`` as a plan's layout does); with only an abstract mesh the blocks run the xla path, and the
    schedule says so. No activation is gathered either way."""
    kernel = native_kernel()
    cfg = B.NeuronConfig(kind="LIF")
    mesh = mesh_lib.make_mesh(spec, jax.devices()[:8 if "data" in spec else 4])
    x = jax.random.normal(jax.random.key(0), (8, 4, 1024), jnp.float64) + 0.5

    def loss(x):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), \
                (temporal.devices(mesh) if devices else contextlib.nullcontext()):
            return jnp.sum(temporal.multistep(cfg, x, kernel=kernel)[0] * x)

    xs = jax.device_put(x, NamedSharding(mesh, P("time", "data")))
    with temporal.recording() as found:
        hlo = jax.jit(jax.grad(loss)).lower(xs).compile().as_text()
    assert [s.block_impl for _, s in found] == ["native" if native else "xla"]
    assert ("SnnNeuronBackwardF64" in hlo) == native
    if "data" in spec and native:  # each call on its device's half of a block's 4 x 1024 neurons
        assert re.findall(r'SnnNeuronBackwardF64", operand_layout_constraints=\{f64\[2,(\d+)\]', hlo)
        assert {int(m) for m in re.findall(r'SnnNeuronBackwardF64", operand_layout_constraints=\{f64\[2,(\d+)\]',
                                           hlo)} == {4 * 1024 // 2 // found[0][1].blocks}
    assert report.collective_stats(hlo)["all-gather"]["count"] == 0


@pytest.mark.parametrize("shape,blocks", [((16, 1, 6, 8), 3), ((16, 1, 1, 8), 0)])
@pytest.mark.parametrize("native", [False, True])
def test_dims_of_size_one(shape, blocks, native):
    mesh = mesh_lib.make_mesh("time=4", jax.devices()[:4])
    kernel = native_kernel() if native else None
    for name in ("LIF-soft-nodecay", "PLIF-hard"):
        _assert_equal_to_unsharded(VARIANTS[name], mesh, blocks, True, True, kernel, shape)


def test_dispatch_runs_the_pipeline_when_the_mesh_splits_time():
    cfg = B.NeuronConfig(kind="LIF")
    mesh = mesh_lib.make_mesh("time=4,data=2")
    x = jax.random.normal(jax.random.key(0), (8, 4, 1024), jnp.float64) + 0.5
    xs = jax.device_put(x, NamedSharding(mesh, P("time", "data")))

    def run(x):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return dispatch.multistep(cfg, x, impl="auto")[0]

    compiled = jax.jit(run).lower(xs).compile()
    np.testing.assert_array_equal(np.asarray(compiled(xs)), np.asarray(xla.multistep(cfg, x)[0]))
    stats = report.collective_stats(compiled.as_text())
    assert stats["collective-permute"]["count"] > 0  # the boundary potential crosses devices
    assert stats["all-gather"]["count"] == 0  # T is never gathered


@pytest.mark.parametrize("impl,block_impl", [("auto", "xla"), ("xla", "xla"), ("native", "native")])
def test_dispatch_runs_the_kernel_an_explicit_impl_names_per_block(impl, block_impl):
    native_kernel()
    cfg = B.NeuronConfig(kind="LIF")
    mesh = mesh_lib.make_mesh("time=4", jax.devices()[:4])
    x = jax.random.normal(jax.random.key(0), (8, 4, 1024), jnp.float64) + 0.5
    xs = jax.device_put(x, NamedSharding(mesh, P("time")))

    def run(x):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return dispatch.multistep(cfg, x, impl=impl)[0]

    with temporal.recording() as found:
        spikes = jax.jit(run)(xs)
    assert [s.block_impl for _, s in found] == [block_impl]
    np.testing.assert_array_equal(np.asarray(spikes), np.asarray(xla.multistep(cfg, x)[0]))


def test_t_must_divide_over_the_time_axis():
    mesh = mesh_lib.make_mesh("time=4,data=2")
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), pytest.raises(ValueError, match="multiple of 4"):
        dispatch.multistep(B.NeuronConfig(), jnp.ones((6, 2, 3)))


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_automatic_blocks_keep_the_bubble_under_ten_percent(shards):
    shape = (64, 8, 48, 48, 64)  # CIFAR10DVSVGG's first layer at T=64, N=8
    s = temporal.layer_schedule(shape, shards)
    assert s.bubble < 0.10 and s.blocks >= temporal.min_blocks(shards)
    assert s.dim == 1  # the merged pixels [48 * 48]: it has a divisor for every P here
    assert s.neurons // s.blocks >= temporal.MIN_BLOCK_NEURONS
    assert temporal.bubble(4, temporal.min_blocks(4)) < 0.10 <= temporal.bubble(4, temporal.min_blocks(4) - 1)


def test_block_rule_falls_back_when_neurons_are_few():
    d, b = temporal.choose_blocks((2, 4, 8), 4)  # 64 neurons: blocks of >= 512 are impossible, so one block
    assert b == 1
    d, b = temporal.choose_blocks((2, 4, 8), 4, blocks=8)
    assert (d, b) == (2, 8)
    with pytest.raises(ValueError, match="parallel.time_blocks=3 .* divides none"):
        temporal.choose_blocks((2, 4, 8), 4, blocks=3)


def test_bytes_sent_match_the_compiled_collective_permutes():
    """Forward + backward send each device's potential and its gradient once per block: 2 x neurons x 8 bytes."""
    cfg = B.NeuronConfig(kind="LIF")
    mesh = mesh_lib.make_mesh("time=8")
    shape = (16, 4, 16, 64)
    x = jax.random.normal(jax.random.key(0), shape, jnp.float64)
    sched = temporal.layer_schedule(shape, 8, jnp.float64)

    def loss(x):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return jnp.sum(temporal.multistep(cfg, x)[0] * x)

    xs = jax.device_put(x, NamedSharding(mesh, P("time")))
    stats = report.collective_stats(jax.jit(jax.grad(loss)).lower(xs).compile().as_text())
    per_tick = 2 * sched.neurons // sched.blocks * 8  # one block's potential forward and gradient backward
    assert stats["collective-permute"]["bytes"] == per_tick * sched.ticks
