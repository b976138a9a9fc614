"""Parallel plans: logical names, rule tables, the divisibility fallback, auto mode, reports, errors, training."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from snnjax import parallel
from snnjax.layers import BatchNorm
from snnjax.layers.pooling import _max_pool, max_pool2d
from snnjax.models import CIFAR10DVSVGG, Spikformer, SpikingMLP
from snnjax.models.units import Unit
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import rules
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train import train_and_evaluate


def abstract(fn):
    return nnx.eval_shape(fn)


def tiny_spikformer(heads=8, dims=32):
    return abstract(lambda: Spikformer(T=2, img_size_h=32,
                                       img_size_w=32, in_channels=2, num_classes=10, embed_dims=dims,
                                       num_heads=heads, depths=1, mlp_ratio=2, rngs=nnx.Rngs(0)))


# -- logical names and analyze -------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: SpikingMLP(16, (32, 32, 32), 10, batch_norm=True, spiking_neuron="PLIF", rngs=nnx.Rngs(0)),
    lambda: CIFAR10DVSVGG(rngs=nnx.Rngs(0)),
    lambda: Spikformer(rngs=nnx.Rngs(0)),
])
def test_every_parameter_is_named_and_tp_layers_alternate(make):
    info = parallel.analyze(abstract(make))
    assert info["neurons"] and info["num_params"] > 0
    for p in info["parameters"]:  # scalars (PLIF's w) need no names
        assert p["logical_axes"] is not None or p["shape"] == (), p
        assert p["logical_axes"] is None or len(p["logical_axes"]) == len(p["shape"])
    roles = [layer["role"] for layer in info["tp_layers"]]
    assert roles.count("column") >= roles.count("row") >= 1
    assert info["unannotated"] == []


def test_vgg_alternates_column_and_row_and_bn_follows_channels():
    model = abstract(lambda: CIFAR10DVSVGG(rngs=nnx.Rngs(0)))
    roles = {layer["layer"]: layer["role"] for layer in parallel.analyze(model)["tp_layers"]}
    assert [roles[f"features.{i}.conv"] for i in range(8)] == ["column", "row"] * 4
    p = parallel.plan(model, 8, mode="tp")
    assert p.layout_of("features.0.conv.kernel").param == P(None, None, None, "tensor")
    assert p.layout_of("features.1.conv.kernel").param == P(None, None, "tensor", None)
    assert p.layout_of("features.0.bn.scale").param == P("tensor")
    assert p.layout_of("features.1.bn.scale").param == P(None)
    assert p.layout_of("classifier.kernel").param == P(None, None)


def test_spikformer_attention_is_split_by_whole_heads():
    model = tiny_spikformer(heads=4)
    attn = model.blocks[0].attn
    assert attn.qkv.fc.kernel.shape == (32, 3, 4, 8) and attn.proj.fc.kernel.shape == (4, 8, 32)
    for tensor in (2, 4):
        p = parallel.plan(model, tensor, mode="tp")
        assert p.layout_of("blocks.0.attn.qkv.fc.kernel").param == P(None, None, "tensor", None)
        assert p.layout_of("blocks.0.attn.qkv.bn.scale").param == P(None, "tensor", None)
        assert p.layout_of("blocks.0.attn.proj.fc.kernel").param == P("tensor", None, None)
        assert p.layout_of("blocks.0.mlp.fc1.fc.kernel").param == P(None, "tensor")
        assert p.layout_of("blocks.0.mlp.fc2.fc.kernel").param == P("tensor", None)
    # 8 devices, 4 heads: heads cannot be split 8 ways and stay whole; head_dim is never split
    p = parallel.plan(model, 8, mode="tp")
    lay = p.layout_of("blocks.0.attn.qkv.fc.kernel")
    assert lay.param == P(None, None, None, None) and any("heads" in n for n in lay.notes)


def test_annotation_can_be_changed_and_is_validated():
    model = abstract(lambda: SpikingMLP(8, (16,), 4, rngs=nnx.Rngs(0)))
    assert parallel.logical_axes(model.fcs[0].kernel) == ("embed", "mlp")
    assert parallel.plan(model, 4, mode="tp").layout_of("fcs.0.kernel").param == P(None, "tensor")
    parallel.annotate(model.fcs[0].kernel, "mlp", "embed")  # make it row-parallel instead
    assert parallel.plan(model, 4, mode="tp").layout_of("fcs.0.kernel").param == P("tensor", None)
    with pytest.raises(ValueError, match="one name"):
        parallel.annotate(model.fcs[0].kernel, "embed")


# -- rule tables ----------------------------------------------------------------------------------


def test_fsdp_shards_the_largest_divisible_dim_and_zero_the_optimizer():
    sizes = {"data": 2, "fsdp": 4, "tensor": 2, "stage": 1}
    assert rules.add_axis(P(None, None), (6, 16), "fsdp", sizes) == P(None, "fsdp")
    assert rules.add_axis(P(None, None), (12, 8), "fsdp", sizes) == P("fsdp", None)
    assert rules.add_axis(P(None, None), (3, 5), "fsdp", sizes) == P(None, None)  # nothing divides: replicated
    assert rules.add_axis(P(None, "tensor"), (4, 64), "fsdp", sizes) == P(None, ("tensor", "fsdp"))
    lay = rules.array_layout(("embed", "mlp"), (64, 32), rules.get_strategy("hybrid", 2), sizes)
    assert lay.compute == P(None, "tensor")
    assert lay.param == P("fsdp", "tensor")
    assert lay.opt == lay.grad == P(("fsdp", "data"), "tensor")
    z1 = rules.array_layout(("embed", "mlp"), (64, 32), rules.get_strategy("zero1"), {**sizes, "fsdp": 1})
    assert z1.param == z1.grad == z1.compute == P(None, None) and z1.opt == P("data", None)
    small = rules.array_layout(("mlp",), (32,), rules.get_strategy("fsdp"), sizes, min_shard_size=64)
    assert small.param == P(None)


def test_plan_reports_bytes_per_device():
    model = abstract(lambda: CIFAR10DVSVGG(rngs=nnx.Rngs(0)))
    full = parallel.plan(model, 1, mode="none").totals()
    fsdp = parallel.plan(model, 8, mode="fsdp").totals()
    assert full["param_bytes"] == full["param_bytes_per_device"] == pytest.approx(4 * 9.23e6, rel=0.01)
    assert fsdp["param_bytes_per_device"] + fsdp["optimizer_bytes_per_device"] <= \
        1.05 * (full["param_bytes_per_device"] + full["optimizer_bytes_per_device"]) / 8
    d = parallel.plan(model, 64, mode="fsdp").as_dict()  # more devices than this machine has: inspection only
    assert d["mesh"]["fsdp"] == 64 and json.dumps(d)
    assert "all-gather" in str(parallel.plan(model, 8, mode="fsdp"))


def test_auto_mode_records_why():
    model = abstract(lambda: CIFAR10DVSVGG(rngs=nnx.Rngs(0)))
    speed = parallel.plan(model, 8, mode="auto", objective="speed", memory_budget_bytes=16 * 2**30)
    assert speed.mode == "dp" and "all-reduce" in speed.reasons[-1]
    tight = parallel.plan(model, 8, mode="auto", objective="speed", memory_budget_bytes=200 * 2**20)
    assert tight.mode == "zero2" and "ZeRO-2" in tight.reasons[-1]
    tighter = parallel.plan(model, 8, mode="auto", objective="speed", memory_budget_bytes=80 * 2**20)
    assert tighter.mode == "fsdp"
    memory = parallel.plan(model, 8, mode="auto", objective="memory")
    assert memory.mode == "fsdp" and memory.axis_sizes["fsdp"] == 8 and memory.reasons
    odd = parallel.plan(model, 8, mode="auto", objective="memory", global_batch_size=12)
    assert odd.mode == "fsdp_tp" and odd.axis_sizes["tensor"] == 2 and "12" in odd.reasons[0]
    assert parallel.plan(model, 1, mode="auto").mode == "none"


class _Chain(nnx.Module):
    """Two dense units with no tensor-parallel names: only data parallelism or a pipeline can use devices."""

    def __init__(self, rngs: nnx.Rngs):
        self.a, self.b = nnx.Linear(4, 8, rngs=rngs), nnx.Linear(8, 3, rngs=rngs)

    def units(self) -> list[Unit]:
        return [Unit("a", ("a",), self.a), Unit("b", ("b",), self.b)]


def test_auto_mode_chooses_a_pipeline_when_nothing_else_fits():
    vgg = abstract(lambda: CIFAR10DVSVGG(rngs=nnx.Rngs(0)))
    # 141.5 MiB replicated, 48.6 MiB under ZeRO-2: 40 MiB of state per device leaves a pipeline over 4 stages
    tight = parallel.plan(vgg, 8, mode="auto", memory_budget_bytes=80 * 2**20, global_batch_size=16,
                          pipeline=PipelineOptions())
    assert tight.mode == "pp" and tight.axis_sizes["stage"] == 4 and tight.axis_sizes["data"] == 2
    assert "pipeline over stage=4" in " ".join(tight.reasons) and tight.packing is not None
    assert tight.packing.width * 4 * 4 <= 40 * 2**20
    assert parallel.plan(vgg, 8, mode="auto", memory_budget_bytes=30 * 2**20, global_batch_size=16,
                         pipeline=PipelineOptions()).mode == "fsdp"  # no stage count fits either
    # A batch of 4 on 8 devices and no tensor-parallel layers: the other factor 2 pipelines the units.
    chain = abstract(lambda: _Chain(nnx.Rngs(0)))
    odd = parallel.plan(chain, 8, mode="auto", global_batch_size=4, pipeline=PipelineOptions())
    assert odd.mode == "pp" and odd.axis_sizes["stage"] == 2 and odd.axis_sizes["data"] == 4
    assert odd.pipeline.layout == (1, 1)
    with pytest.raises(ValueError, match="enough units to pipeline over 4 stages"):
        parallel.plan(chain, 8, mode="auto", global_batch_size=2, pipeline=PipelineOptions())


# -- invalid layouts -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,mesh,zero,message", [
    ("tp", "data=8", None, "needs the mesh axis 'tensor' > 1"),
    ("fsdp", "data=8", None, "needs the mesh axis 'fsdp' > 1"),
    ("dp_tp", "tensor=8", None, "needs the mesh axis 'data' > 1"),
    ("dp", "data=4,tensor=2", None, "set tensor=1 or choose a mode that uses 'tensor'"),
    ("fsdp", "fsdp=4,stage=2", None, "mode=pp .mode=.pp. in Python., or stage=1"),
    ("tp", "tensor=8", 1, "zero_stage=1 shards over the data axis"),
    ("dp", "data=8", 3, "zero_stage must be 0, 1 or 2"),
    ("pp", "data=8", None, "pipelines over the mesh axis stage"),
    ("pipeline", "data=8", None, "is not known"),
])
def test_invalid_layouts_say_what_to_change(mode, mesh, zero, message):
    model = abstract(lambda: SpikingMLP(16, (16,), 10, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=message):
        parallel.plan(model, mesh_lib.make_mesh(mesh), mode=mode, zero_stage=zero)


def test_invalid_sizes_say_what_to_change():
    model = abstract(lambda: SpikingMLP(16, (16,), 10, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="sequence_parallel splits activations over the tensor axis"):
        parallel.plan(model, mesh_lib.make_mesh("data=8"), mode="dp", sequence_parallel=True)
    with pytest.raises(ValueError, match="needs 6 devices but 8 are available"):
        parallel.plan(model, "data=3,tensor=2", mode="dp_tp")
    with pytest.raises(ValueError, match="does not divide over data x fsdp = 8"):
        parallel.plan(model, mesh_lib.make_mesh("data=8"), mode="dp", global_batch_size=12)
    with pytest.raises(ValueError, match="neither tensor-parallel layers"):
        parallel.plan(abstract(lambda: nnx.Linear(4, 4, rngs=nnx.Rngs(0))), 8, mode="auto", global_batch_size=12)
    with pytest.raises(ValueError, match="this process does not have"):
        parallel.plan(model, 64, mode="fsdp").param_shardings(nnx.state(model, nnx.Param))


# -- pieces the layouts rely on ---------------------------------------------------------------------


@pytest.mark.parametrize("k,s,p,size", [(3, 2, 1, 9), (3, 2, 1, 8), (2, 2, 0, 8), (3, 3, 0, 10), (2, 1, 1, 5)])
def test_max_pool_equals_reduce_window_and_its_select_and_scatter_gradient(x64, k, s, p, size):
    x = jnp.round(jax.random.normal(jax.random.key(0), (2, 3, size, size, 4), jnp.float64) * 1.5)  # many ties
    x = x.at[0, 0, 0, 0, 0].set(-jnp.inf)
    g = jax.random.normal(jax.random.key(1), _max_pool(x, k, s, p).shape, jnp.float64)
    outs = [jax.vjp(lambda x, f=f: f(x, k, s, p), x) for f in (_max_pool, max_pool2d)]
    (ya, vjp_a), (yb, vjp_b) = outs
    np.testing.assert_array_equal(yb, ya)
    # the first maximum of each window, row-major; overlapping windows add their shares in another order
    np.testing.assert_allclose(vjp_b(g)[0], vjp_a(g)[0], rtol=1e-13, atol=1e-13)


def test_batchnorm_over_several_channel_dims_equals_flat_channels():

    @jax.jit
    def run(x):
        flat, split = BatchNorm(24), BatchNorm((3, 2, 4))
        return split(x.reshape(2, 3, 5, 3, 2, 4)).reshape(x.shape), flat(x), split.var[...].reshape(-1), flat.var[...]

    a, b, var_a, var_b = run(jax.random.normal(jax.random.key(0), (2, 3, 5, 24)))
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # float32 outputs of unit scale, some near zero
    np.testing.assert_allclose(var_a, var_b, rtol=1e-6)


def test_collective_stats_counts_loop_trips_and_sliced_all_reduces():

    mesh = mesh_lib.make_mesh("data=4,tensor=2")

    def f(w, x):
        def body(acc, xi):
            g = jax.grad(lambda w: jnp.sum(jnp.tanh(xi @ w)))(w)
            return acc + jax.lax.with_sharding_constraint(g, NamedSharding(mesh, P("data", None))), None

        return jax.lax.scan(body, jnp.zeros_like(w), x)[0]

    w = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P(None, "tensor")))
    x = jax.device_put(jnp.ones((3, 16, 64)), NamedSharding(mesh, P(None, "data")))
    stats = parallel.collective_stats(jax.jit(f).lower(w, x).compile().as_text())
    assert stats["all-reduce"]["count"] == 3  # once per trip of the 3-step loop
    assert stats["all-reduce"]["bytes"] == 3 * 64 * 16 * 4  # a [64, 16] float32 gradient per device
    assert stats["all-reduce+slice"]["count"] == 3


# -- training ------------------------------------------------------------------------------------


def test_training_prints_and_records_the_step_cost(tmp_path, capsys):


    spec = importlib.util.spec_from_file_location(
        "digits_config", pathlib.Path(__file__).resolve().parents[1] / "configs" / "digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.num_steps, c.log_every_steps, c.checkpoint_every_steps, c.global_batch_size = 2, 1, 2, 16
    c.grad_accum_steps = 2  # each microbatch of 8 is split over fsdp=4 as well
    c.parallel.mode, c.parallel.mesh, c.parallel.print_summary = "fsdp_tp", "fsdp=4,tensor=2", True
    summary = train_and_evaluate(c, tmp_path)
    out = capsys.readouterr().out
    assert "per-device cost of one train step" in out and "all-gather" in out and "(tensor+fsdp)" in out
    par = json.loads((tmp_path / "summary.json").read_text())["parallel"]
    assert summary["mode"] == par["mode"] == "fsdp_tp" and summary["mesh"]["fsdp"] == 4
    assert par["per_device"]["param_bytes"] < 19210 * 4 / 4 and par["per_device"]["activation_bytes"] > 0
    assert par["collectives"]["all-gather"]["count"] > 0 and np.isfinite(summary["train_loss"])
