"""Temporal parallelism in plans and configs: the mesh axis, the checks, the summary and per-device memory."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import quick_compiles
from flax import nnx
from helpers import native_kernel
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax import parallel
from snnjax.bench import temporal as temporal_bench
from snnjax.models import CIFAR10DVSVGG
from snnjax.neurons import base as B
from snnjax.neurons.kernels import dispatch
from snnjax.neurons.kernels import temporal as neuron_temporal
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import report
from snnjax.parallel import temporal as temporal_lib
from snnjax.train import config as config_lib


def small_vgg():
    return CIFAR10DVSVGG(widths=(8, 8, 16, 16, 16, 16, 16, 16), image_size=16, dropout=0.0, rngs=nnx.Rngs(0))


def test_time_axis_in_the_mesh_and_every_strategy_maps_time_to_it():
    assert mesh_lib.mesh_shape("time=4,data=-1", 8) == {"data": 2, "fsdp": 1, "tensor": 1, "stage": 1, "time": 4}
    for name, strategy in parallel.STRATEGIES.items():
        assert strategy.rules["time"] == "time", name


def test_plan_states_the_time_split_and_carries_the_block_count():
    model = small_vgg()
    p = parallel.plan(model, mesh_lib.make_mesh("time=4,data=2"), mode="dp", time_steps=8, time_blocks=2)
    assert p.temporal["time_shards"] == 4 and p.temporal["steps_per_shard"] == 2 and p.temporal["blocks"] == 2
    assert p.temporal["bubble"] == pytest.approx(3 / 5)
    text = str(p)
    assert "temporal: T over time=4 (2 steps per device)" in text and "2 blocks: bubble 60.0%" in text
    assert any(c["kind"] == "collective-permute" and c["over"] == ("time",) for c in p.expected_collectives)
    layout = p.step_layout(nnx.state(model, nnx.Param))
    assert isinstance(layout, temporal_lib.StepLayout) and layout.time_blocks == 2
    assert p.as_dict()["temporal"]["time_shards"] == 4
    auto = parallel.plan(model, mesh_lib.make_mesh("time=4,data=2"), mode="dp")
    assert "auto blocks (>= 28" in str(auto)
    assert parallel.plan(model, mesh_lib.make_mesh("data=8"), mode="dp").temporal is None


def test_plan_rejects_t_that_does_not_divide():
    with pytest.raises(ValueError, match="multiple of 4"):
        parallel.plan(small_vgg(), mesh_lib.make_mesh("time=4,data=2"), mode="dp", time_steps=6)


@pytest.mark.parametrize("overrides,message", [
    ({"parallel.mesh": "time=4,data=2", "data.time_steps": 6}, "does not divide over the mesh axis time=4"),
    ({"parallel.time_blocks": -1}, "time_blocks must be an integer >= 0"),
    ({"parallel.mode": "auto", "parallel.mesh": "time=2,data=4"}, "does not choose temporal parallelism"),
])
def test_config_validation_says_what_to_change(overrides, message):
    c = config_lib.base_config()
    for key, value in overrides.items():
        section, _, leaf = key.rpartition(".")
        (c[section] if section else c)[leaf] = value
    with pytest.raises(ValueError, match=message):
        config_lib.validate(c)


def test_config_accepts_a_time_layout():
    c = config_lib.base_config()
    c.parallel.mesh, c.data.time_steps, c.parallel.time_blocks = "time=4,data=2", 8, 4
    config_lib.validate(c)


def test_neuron_schedules_list_every_layer_without_devices():
    scheds = temporal_lib.neuron_schedules(small_vgg(), (64, 2, 16, 16, 2), 4)
    assert len(scheds) == 8  # one LIF per VGG block
    assert scheds[0][0] == (64, 2, 16, 16, 8)
    assert all(s.shards == 4 and s.bubble == neuron_temporal.bubble(4, s.blocks) for _, s in scheds)
    assert "bytes sent/step" in temporal_lib.format_schedules(scheds)


def _layer_bytes(shards: int, shape) -> int:
    """Per-device arguments + temporaries of a compiled LIF forward + backward with T over ``time=shards``."""
    mesh = mesh_lib.make_mesh(f"time={shards}", jax.devices()[:shards])
    cfg = B.NeuronConfig(kind="LIF")

    def fwd_bwd(x, ds):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            s, vjp = jax.vjp(lambda x: dispatch.multistep(cfg, x, impl="xla")[0], x)
            return s, vjp(ds)[0]

    arg = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P("time")))
    mem = report.memory_stats(jax.jit(fwd_bwd).lower(arg, arg).compile())
    return mem["argument_bytes"] + mem["temp_bytes"]


def test_per_device_memory_of_a_neuron_layer_falls_as_one_over_p():
    shape = (64, 2, 16, 16, 32)
    one = _layer_bytes(1, shape)
    for shards in (2, 4, 8):
        assert _layer_bytes(shards, shape) <= 1.1 * one / shards, shards


def test_temporal_bench_records_each_impl_per_block():
    native_kernel()  # skips where the native kernels cannot be built
    records = temporal_bench.layer_records(8, "time=2", 1, 4, ["xla", "native"], repeats=0)
    assert [(r["neuron_impl"], r["block_impl"]) for r in records] == [("xla", "xla"), ("native", "native")]
    for r in records:
        assert r["collectives"]["collective-permute"]["count"] > 0 and r["ms"] is None
        assert 0 < r["bubble"] < 1 and r["temp_bytes_per_device"] > 0


@pytest.mark.parametrize("spec", ["time=2,data=4", "time=4,data=2"])
def test_time_and_data_split_gather_no_activations(spec):
    """Convolutions merge [T, N] with each device's block contiguous, so the step gathers nothing over time.
    (Compiled with ``quick_compiles``: the collectives are placed by XLA's partitioner, before the passes it skips.)"""
    with quick_compiles():
        records = temporal_bench.model_records(8, spec, 8, 16, ["xla"], repeats=0)
    assert "all-gather" not in records[0]["collectives"] and "all-to-all" not in records[0]["collectives"]
    assert records[0]["collectives"]["collective-permute"]["count"] > 0  # the neurons' pipeline
