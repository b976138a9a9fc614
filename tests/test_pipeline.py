"""The pipeline over ``stage`` trains exactly like one device with the same microbatching (float64).

For a small CIFAR10DVSVGG (dropout on, so each microbatch's dropout key matters): every schedule on
stage=4 (interleaved: 2 virtual stages per device) and on stage=2 x data=2 x tensor=2; 1F1B,
interleaved and zero-bubble on stage=2 with more microbatches than stages; 1F1B on stage=2 x fsdp=4;
zero-bubble under each checkpointing policy (``SNNJAX_ALL_CASES=1``: also 1F1B on stage=2 x data=4 with
checkpointed units). For a tiny Spikformer (patch stages, positional encoding, attention blocks and
head as units; attention heads on tensor): the interleaved schedule
on stage=2 x data=2 x tensor=2, two virtual stages per device. Each must give the single-device loss
and gradients of the first step (``train_step`` with ``grad_accum_steps = M``, no checkpointing),
and after three Adam steps the same parameters, optimizer state and BatchNorm statistics (relative
error <= 1e-9). The suite runs the cover ``CASES`` (each schedule, mesh and model at least once);
``SNNJAX_ALL_CASES=1`` every case.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import (
    ALL_CASES,
    BATCH,
    COMPILER_OPTIONS,
    TOL,
    assert_same_training,
    initial_state,
    rel,
    suite_cases,
    train_layout,
)

from snnjax import parallel
from snnjax.bench.pipeline import w_contractions
from snnjax.models import CIFAR10DVSVGG, Spikformer, remat
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import pipeline_plan, pipeline_tables, schedules
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train import apply_plan
from snnjax.train.sharded import eval_fn
from snnjax.train.step import StepConfig


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module):
    yield
    _run.cache_clear()
    _setup.cache_clear()


def build(name: str):
    kw = dict(rngs=nnx.Rngs(params=0, dropout=1), dtype=jnp.float64, param_dtype=jnp.float64)
    if name == "vgg":  # 9 units: 8 blocks and the head
        return (CIFAR10DVSVGG(widths=(8, 8, 8, 8, 8, 8, 8, 8), image_size=16, dropout=0.25, **kw),
                (2, BATCH, 16, 16, 2))
    # 8 units: 4 patch stages, the positional encoding, 2 blocks, the head; over 2 stages x 2 virtual stages
    # (4|1|1|2) the chunks hand on image activations, tokens, and tokens between blocks
    return (Spikformer(T=2, img_size_h=16,
                       img_size_w=16, in_channels=2, num_classes=10, embed_dims=16, num_heads=2, depths=2,
                       mlp_ratio=2, **kw), (2, BATCH, 16, 16, 2))


REMAT = {"units": "units", "spikes": "spikes", "dots_saveable": "dots_saveable",
         "mix": {"features.0": "units", "features.2": "spikes", "features.5": "dots_saveable"}}


@functools.cache
def _setup(model_name: str, policy: str = "none"):
    model, shape = build(model_name)
    if policy != "none":
        remat.configure(model, REMAT[policy], "bits" if policy == "mix" else "float")
    return initial_state(model, shape)


@functools.cache
def _run(model_name: str, mesh_spec: str | None, schedule: str, microbatches: int, virtual: int = 1,
         policy: str = "none"):
    """``(first-step metrics with grads, state after 3 steps, plan, compiled step)``; mesh None: one device;
    ``policy``: a key of ``REMAT`` (the model's checkpointing; ``mix``: per unit, spikes stored as bits)."""
    cfg = StepConfig(seed=0, time_steps=2, encoder=None, compute_dtype=jnp.float64, return_grads=True,
                     grad_accum_steps=microbatches if mesh_spec is None else 1)
    return train_layout(_setup(model_name, policy), cfg, mesh_spec, mode="pp", global_batch_size=BATCH,
                        pipeline=PipelineOptions(schedule, virtual, microbatches))[:4]


# VGG: every schedule on stage=4 and on stage=2 x data=2 x tensor=2; on stage=2 with 4 microbatches, more than
# stages, the schedules that then reuse their buffer slots (GPipe holds every microbatch's: nothing new there);
# 1F1B with fsdp inside. Spikformer (the slowest to compile), its units unlike VGG's: interleaved, data x tensor.
EVERY = [("vgg", f"stage={s}", sched, 4, 2 if sched == "interleaved" else 1)
         for s in (2, 4) for sched in pipeline_plan.SCHEDULES if s == 4 or sched != "gpipe"]
EVERY += [("vgg", "stage=2,data=2,tensor=2", sched, 2, 2 if sched == "interleaved" else 1)
          for sched in pipeline_plan.SCHEDULES]
EVERY += [("vgg", "stage=2,fsdp=4", "1f1b", 2, 1), ("spikformer", "stage=2,data=2,tensor=2", "interleaved", 2, 2)]
# The suite's cover: each schedule, each mesh, slot reuse (zero-bubble, the most buffers) and both models.
CASES = suite_cases(EVERY, [("vgg", "stage=4", "gpipe", 4, 1), ("vgg", "stage=4", "interleaved", 4, 2),
                            ("vgg", "stage=2", "zero_bubble", 4, 1), ("vgg", "stage=2,data=2,tensor=2", "1f1b", 2, 1),
                            ("vgg", "stage=2,data=2,tensor=2", "zero_bubble", 2, 1), EVERY[-2], EVERY[-1]])


@pytest.mark.parametrize("model_name,mesh_spec,schedule,microbatches,virtual", CASES)
def test_pipeline_matches_single_device(model_name, mesh_spec, schedule, microbatches, virtual):
    ref_first, ref_state, _, _ = _run(model_name, None, "", microbatches)
    first, state, plan, _ = _run(model_name, mesh_spec, schedule, microbatches, virtual)
    assert plan.pipeline.microbatches == microbatches and plan.pipeline.virtual == virtual
    assert_same_training(first, state, ref_first, ref_state, metrics=("loss", "accuracy"))


@pytest.mark.parametrize("policy", list(REMAT))
def test_zero_bubble_under_each_remat_policy_matches_single_device(policy):
    """The B/W split reaches the contractions inside the checkpointed units: each stage's W runs as many as without
    checkpointing (none before the split inlined the checkpointed bodies), and training equals one device's (under
    the per-unit mix of every policy, and under ``units`` with ``SNNJAX_ALL_CASES=1``; the others are traced only,
    the suite's time)."""
    assert _w_contractions(policy) == _w_contractions("none") and min(_w_contractions("none")) > 0
    if policy not in suite_cases(("units", "mix"), ("mix",)):
        return
    ref_first, ref_state, _, _ = _run("vgg", None, "", 2)
    first, state, _, _ = _run("vgg", "stage=2", "zero_bubble", 2, 1, policy)
    assert_same_training(first, state, ref_first, ref_state, metrics=("loss", "accuracy"))


@functools.cache
def _w_contractions(policy: str) -> list[int]:
    """The contractions each stage's W runs in the zero-bubble step on stage=2 (traced, not compiled)."""
    model, graphdef, tx, host_state, x, y = _setup("vgg", policy)
    plan = parallel.plan(model, mesh_lib.make_mesh("stage=2", jax.devices()[:2]), mode="pp", global_batch_size=BATCH,
                         pipeline=PipelineOptions("zero_bubble", 1, 2))
    cfg = StepConfig(seed=0, time_steps=2, encoder=None, compute_dtype=jnp.float64, return_grads=True)
    state, step = apply_plan(plan, jax.tree.map(lambda a: a.copy(), host_state), cfg, graphdef, tx,
                             batch_axes={"inputs": 1, "labels": 0}, batch_ndims={"inputs": 5, "labels": 1})
    batch = {"inputs": jax.device_put(x, plan.batch_sharding(5, 1)),
             "labels": jax.device_put(y, plan.batch_sharding(1, 0))}
    return w_contractions(step.trace(state, batch).jaxpr, len(plan.pipeline.layout))


@pytest.mark.skipif(not ALL_CASES, reason="SNNJAX_ALL_CASES=1: 1F1B's backward is the stage's plain VJP, checkpointed "
                    "or not; checkpointed units in a pipeline: the zero-bubble test's mix of every policy")
def test_one_f_one_b_with_checkpointed_units_matches_single_device():
    """1F1B on stage=2 x data=4 with every unit checkpointed trains as one device without checkpointing."""
    ref_first, ref_state, _, _ = _run("vgg", None, "", 2)
    first, state, _, _ = _run("vgg", "stage=2,data=4", "1f1b", 2, 1, "units")
    assert_same_training(first, state, ref_first, ref_state, metrics=("loss", "accuracy"))


def test_one_f_one_b_holds_stage_inputs_by_stages_not_microbatches():
    """The executor's buffers: 1F1B keeps at most S stage inputs per device, GPipe all M."""
    for s, m in ((2, 8), (4, 16), (4, 32)):
        assert pipeline_tables.build(schedules.one_f_one_b(s, m)).act_slots == s  # in flight, plus one arriving
        assert pipeline_tables.build(schedules.gpipe(s, m)).act_slots == m
        zb = pipeline_tables.build(schedules.zero_bubble(s, m))
        assert zb.act_slots <= s and zb.w_slots <= s


def test_tables_route_every_send_to_a_slot_that_is_read_before_it_is_overwritten():
    """Every F output (and B input cotangent, and zero-bubble B's stored weight-gradient operands) is stored in a
    slot that its consumer reads at a later tick, before anything else is written to that slot (a write lands at
    the end of its tick, after that tick's read)."""
    for sched in (schedules.gpipe(3, 5), schedules.one_f_one_b(4, 8), schedules.interleaved(2, 4, 2),
                  schedules.zero_bubble(4, 6), schedules.zero_bubble(2, 5)):
        t = pipeline_tables.build(sched)
        buffers = [("act", t.act_write, t.act_read, t.act_slots), ("cot", t.cot_write, t.cot_read, t.cot_slots)]
        if sched.split_backward:  # only B writes W's buffer: every write is meant to be read
            g = sched.num_stages  # branches: F 1..G, B G+1..2G, W 2G+1..3G
            w_written = np.where((t.branch > g) & (t.branch <= 2 * g), t.w_write, -1)
            w_read = np.where(t.branch > 2 * g, t.w_read, -1)
            buffers.append(("w", w_written, w_read, -1))
        for kind, write, read, trash in buffers:
            for d in range(sched.num_devices):
                writes = [(tick, write[tick, d]) for tick in range(t.ticks) if write[tick, d] not in (trash, -1)]
                for tick, slot in writes:
                    following = [w for w, s in writes if s == slot and w > tick]
                    until = following[0] if following else t.ticks - 1
                    assert slot in read[tick + 1:until + 1, d], (sched.name, kind, tick, d, slot)


def test_layout_and_microbatch_choices():
    model = _setup("vgg")[0]  # built once for the module
    with pytest.raises(ValueError, match="add up to the model's 9 units"):
        pipeline_plan.parse_layout("2|2", 9, 2, [u.name for u in model.units()])
    assert pipeline_plan.parse_layout("4|5", 9, 2, [u.name for u in model.units()]) == (4, 5)
    assert pipeline_plan.balance([1, 1, 1, 1, 4], 2) == (4, 1)
    costs = [3, 1, 1, 1, 1, 1]
    layout = pipeline_plan.balance(costs, 3)
    edges = np.cumsum((0,) + layout)
    assert sum(layout) == 6 and max(sum(costs[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)) == 3
    # more microbatches shrink the bubble until the fixed per-action cost dominates; all divide over data
    m = pipeline_plan.choose_microbatches(64, 2, 4, 1, "1f1b")
    assert 64 % m == 0 and (64 // m) % 2 == 0 and 4 <= m <= 32
    with pytest.raises(ValueError, match="no microbatch count"):
        pipeline_plan.choose_microbatches(6, 4, 2, 1, "1f1b")


def test_plan_errors_say_what_to_change():
    model = _setup("vgg")[0]  # built once for the module
    with pytest.raises(ValueError, match="mode=pp"):
        parallel.plan(model, mesh_lib.make_mesh("stage=2,data=4"), mode="dp")
    with pytest.raises(ValueError, match="stage"):
        parallel.plan(model, mesh_lib.make_mesh("data=8"), mode="pp", global_batch_size=8)
    with pytest.raises(ValueError, match="microbatches"):
        parallel.plan(model, mesh_lib.make_mesh("stage=2,data=4"), mode="pp", global_batch_size=8,
                      pipeline=PipelineOptions(microbatches=4))  # 8 / 4 = 2 examples do not split over data=4
    with pytest.raises(ValueError, match="sequence_parallel is not available"):
        parallel.plan(model, mesh_lib.make_mesh("stage=2,data=2,tensor=2"), mode="pp", global_batch_size=8,
                      sequence_parallel=True)
    with pytest.raises(ValueError, match="virtual"):
        parallel.plan(model, mesh_lib.make_mesh("stage=2,data=4"), mode="pp", global_batch_size=8,
                      pipeline=PipelineOptions("1f1b", virtual_stages=2, microbatches=2))


def test_print_summary_shows_the_schedule():
    model, x = _setup("vgg")[0], _setup("vgg")[4]
    plan = parallel.plan(model, mesh_lib.make_mesh("stage=2,data=4"), mode="pp", global_batch_size=8,
                         pipeline=PipelineOptions("1f1b", 1, 2), input_shape=x.shape, compute_dtype=jnp.float64)
    text = str(plan)
    assert "on data=4 x stage=2: a pipeline over stage; within each stage data parallel" in text
    assert "pipeline: 1f1b over stage=2, 2 microbatches" in text and "bubble 33.3%" in text
    assert "d0: F0 F1" in text and "stage 1 (device 1):" in text and "head" in text
    assert sum(plan.pipeline.layout) == 9


def test_each_device_stores_only_its_stages_parameters():
    model = _setup("vgg")[0]  # built once for the module
    mesh = mesh_lib.make_mesh("stage=2,data=4", jax.devices()[:8])
    plan = parallel.plan(model, mesh, mode="pp", global_batch_size=8, pipeline=PipelineOptions("1f1b", 1, 2, "4|5"))
    packing, params = plan.packing, nnx.split(model, nnx.Param, ...)[1]
    packed = packing.pack(params)
    assert packed.shape == (2, packing.width)
    for a, b in zip(jax.tree.leaves(packing.unpack(packed)), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    sizes = [sum(int(np.prod(s)) for s, d in zip(packing.shapes, packing.device, strict=True) if d == dev)
             for dev in range(2)]
    assert packing.width == max(sizes) and sum(sizes) == sum(x.size for x in jax.tree.leaves(params))
    assert plan.totals()["param_bytes_per_device"] == packing.width * 8  # float64: one row, not every stage


def test_eval_under_a_pipeline_splits_the_batch_over_stage_too():
    """Every device holds the whole model once the eval step gathers the stage rows, so the eval batch splits
    over stage x data: one device's sums, and each device evaluates 1/8 of the batch as under data=8 (without
    the split over stage it would evaluate 1/2: twice the FLOPs)."""
    model, graphdef, tx, host_state, x, y = _setup("vgg")
    cfg = StepConfig(seed=0, time_steps=2, encoder=None, compute_dtype=jnp.float64)
    batch = {"inputs": x, "labels": y, "mask": jnp.ones(y.shape, bool).at[-1].set(False)}

    def evaluate(plan):
        state = jax.tree.map(lambda a: a.copy(), host_state)
        if plan.packing is not None:
            state = plan.packing.pack_state(state)
        state = jax.device_put(state, plan.state_shardings(state, tx))
        step = eval_fn(plan, state, cfg, graphdef)
        placed = {k: jax.device_put(v, plan.batch_sharding(v.ndim, 1 if k == "inputs" else 0))
                  for k, v in batch.items()}
        compiled = step.lower(state, placed, jnp.asarray(0)).compile(compiler_options=COMPILER_OPTIONS)
        return jax.device_get(compiled(state, placed, jnp.asarray(0))), compiled.cost_analysis()["flops"]

    one, _ = evaluate(parallel.plan(model, mesh_lib.make_mesh("data=1", jax.devices()[:1]), mode="none"))
    pp, pp_flops = evaluate(parallel.plan(model, mesh_lib.make_mesh("stage=2,data=4"), mode="pp",
                                          global_batch_size=BATCH, pipeline=PipelineOptions("1f1b", 1, 2)))
    _, dp_flops = evaluate(parallel.plan(model, mesh_lib.make_mesh("data=8"), mode="dp"))
    assert one["count"] == BATCH - 1
    for k in one:
        assert rel(pp[k], one[k]) <= TOL, k
    assert pp_flops <= 1.1 * dp_flops, (pp_flops, dp_flops)
