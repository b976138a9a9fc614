"""The memory search: estimates from traced programs, candidates fastest first, the first whose compiled peak
fits is chosen, and the analyses it compiles for are those of the real step."""
import functools

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from snnjax import parallel
from snnjax.models import create_model
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import pipeline_plan
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train import memory_estimate as me
from snnjax.train import memory_search as ms
from snnjax.train import pipeline_memory as pm
from snnjax.train.step import StepConfig

SHAPE = (8, 16, 8, 8, 2)


@pytest.fixture(scope="module")
def setup(x32_module):
    kwargs = dict(widths=(8, 8, 16), pools=(False, True, False), image_size=8, in_channels=2, num_classes=4)
    model = nnx.eval_shape(lambda: create_model("cifar10dvs_vgg", kwargs, rngs=nnx.Rngs(0)))
    batch = {"inputs": jax.ShapeDtypeStruct(SHAPE, jnp.float32), "labels": jax.ShapeDtypeStruct((16,), jnp.int32)}
    cfg, tx = StepConfig(seed=0, time_steps=8, encoder=None), optax.adam(1e-3)
    base = me.step_base_bytes(ms.abstract_state(model, tx), batch)
    units = me.profile_units(model, batch["inputs"], "bits")
    float_units = me.profile_units(model, batch["inputs"], "float", policies=("none",))
    plans = ms.candidates(units, float_units, base)
    return model, cfg, tx, batch, plans, ms.step_compiler(model, cfg, tx, batch)


def test_live_peak_counts_values_from_definition_to_last_use():
    def f(x):  # x: 4 KiB; a and b live together, then c replaces them
        a = jnp.cumsum(x)
        b = jnp.cumsum(a)
        c = jnp.sort(a * b)
        return jnp.sum(c)

    jaxpr = jax.make_jaxpr(f)(jnp.zeros(1024, jnp.float32)).jaxpr
    assert me.live_peak(jaxpr) == 4096 * 4  # x, a, b and a * b while a * b is written


def test_live_peak_takes_elementwise_chains_as_fused():
    def f(x):  # sin and cos fuse into the product, which the sort needs in memory
        return jnp.sort(jnp.sin(x) * jnp.cos(x))

    jaxpr = jax.make_jaxpr(f)(jnp.zeros(1024, jnp.float32)).jaxpr
    assert me.live_peak(jaxpr) == 4096 * 3  # x, the product and the sorted copy


def test_candidates_start_without_checkpointing_and_recompute_more_and_more(setup):
    _, _, _, _, plans, _ = setup
    assert plans[0].candidate.settings == ms.remat.NONE and plans[0].recompute_flops == 0
    assert plans[1].candidate.settings.spike_residuals == "bits"
    flops = [p.recompute_flops for p in plans]
    assert flops == sorted(flops) and flops[-1] > 0
    assert plans[-1].estimate_bytes < plans[1].estimate_bytes <= plans[0].estimate_bytes
    assert len({p.candidate.describe() for p in plans}) == len(plans)


def test_offloaded_candidates_follow_every_checkpointing_plan(setup):
    model, _, tx, batch, plans, _ = setup
    units = me.profile_units(model, batch["inputs"], "bits")
    float_units = me.profile_units(model, batch["inputs"], "float", policies=("none",))
    both = ms.candidates(units, float_units, 10**6, ("none", "opt_state"), offloaded_bytes=1000)
    n = len(plans)
    assert [p.candidate.offload for p in both] == ["none"] * n + ["opt_state"] * n
    for kept, offloaded in zip(both[:n], both[n:], strict=True):
        assert offloaded.candidate.settings == kept.candidate.settings
        assert offloaded.estimate_bytes == kept.estimate_bytes - 1000
        assert offloaded.candidate.describe() == kept.candidate.describe() + ", offload=opt_state"


def test_search_chooses_the_first_that_fits_by_its_compiled_peak(setup):
    _, _, _, _, plans, compile_for = setup
    first = ms.measure(compile_for, plans[0].candidate)
    last = ms.measure(compile_for, plans[-1].candidate)
    assert last.peak_bytes < first.peak_bytes
    budget = (last.peak_bytes + first.peak_bytes) // 2
    result = ms.search(plans, compile_for, budget)
    assert result.chosen is not None and result.chosen.peak_bytes <= budget
    assert all(m.peak_bytes > budget for m in result.tried[:-1])
    assert result.optimize_ms >= result.compile_ms > 0
    assert "chosen: " + result.chosen.candidate.describe() in result.summary()


def test_search_reports_when_nothing_fits(setup):
    _, _, _, _, plans, compile_for = setup
    result = ms.search(plans, compile_for, 1)
    assert result.chosen is None and result.tried[-1].candidate == plans[-1].candidate
    assert "nothing fits" in result.summary()


def test_analysis_compile_reads_the_same_memory_and_cost_as_the_real_one(setup):
    model, cfg, tx, batch, plans, compile_for = setup
    real = ms.step_compiler(model, cfg, tx, batch, analysis_only=False)
    for plan in (plans[0], plans[-1]):
        a, b = ms.measure(compile_for, plan.candidate), ms.measure(real, plan.candidate)
        assert (a.peak_bytes, a.temp_bytes, a.flops) == (b.peak_bytes, b.temp_bytes, b.flops)


class _Compiled:
    """What ``memory_search.measure`` reads of a compiled step, for a given peak."""

    def __init__(self, peak):
        self.peak = peak

    def memory_analysis(self):
        return type("Stats", (), dict(argument_size_in_bytes=0, output_size_in_bytes=0, alias_size_in_bytes=0,
                                      temp_size_in_bytes=self.peak))()

    def cost_analysis(self):
        return {"flops": 1.0}


def test_pipeline_search_orders_by_estimated_time_and_skips_what_a_miss_rules_out():
    cands = pm.candidates([(4, 10.0), (2, 11.0), (8, 12.0)])
    assert [(c.microbatches, c.settings.default) for c in cands[:4]] == [(4, "none"), (4, "none"), (2, "none"),
                                                                          (2, "none")]
    assert cands[-1].microbatches == 8 and cands[-1].settings.default == "units"  # 12 x 4/3 is the slowest
    peaks = {(m, i): 1000 // m - 10 * i for m in (2, 4, 8) for i in range(3)}  # falls with M and along the plans
    compiled = []

    def compile_for(c):
        compiled.append(c)
        return _Compiled(peaks[c.microbatches, pm.PLANS.index(c.settings)])

    result = pm.search(cands, compile_for, 120)
    assert result.chosen.peak_bytes <= 120 and result.chosen.candidate.microbatches == 8
    # (4, none/float) missed, so (2, none/float) and (2, none/bits)... with fewer microbatches are never compiled
    assert all(not (c.microbatches <= 4 and pm.PLANS.index(c.settings) == 0) for c in compiled[1:])
    assert len(compiled) < len(cands) and "8 microbatches" in result.summary()


def _first_fit(cands, peaks, budget):
    """What compiling every candidate would choose: the first (fastest) whose peak fits."""
    return next((c for c in cands if peaks[c] <= budget), None)


def _search_equals_compiling_everything(cands, peaks):
    """For every budget at and just below each peak, the search chooses what compiling every candidate would."""
    for budget in sorted({p + d for p in peaks.values() for d in (-1, 0)}):
        result = pm.search(cands, lambda c: _Compiled(peaks[c]), budget)
        assert (result.chosen and result.chosen.candidate) == _first_fit(cands, peaks, budget), budget


def test_pipeline_search_assumes_nothing_across_plans_or_offloads():
    """Peaks that rise along the plans (zero-bubble's W buffers do not shrink with checkpointing) and fall with
    offload: a miss rules out only the same plan and offload with fewer microbatches, so the search chooses what
    compiling every candidate would; a miss without offload does not rule out the same plan offloaded."""
    cands = pm.candidates([(8, 12.0), (4, 13.0), (2, 20.0)]) + pm.candidates([(8, 12.0), (4, 13.0), (2, 20.0)],
                                                                              "opt_state")
    peaks = {c: {2: 300, 4: 250, 8: 200}[c.microbatches] + 10 * pm.PLANS.index(c.settings)
             - (60 if c.offload == "opt_state" else 0) for c in cands}
    chosen = pm.search(cands, lambda c: _Compiled(peaks[c]), 190).chosen.candidate  # every plan misses unoffloaded
    assert (chosen.microbatches, chosen.settings, chosen.offload) == (8, pm.PLANS[0], "opt_state")
    _search_equals_compiling_everything(cands, peaks)


def test_pipeline_search_on_real_zero_bubble_peaks(x32_module):
    """Every candidate of a zero-bubble pipeline on stage=2 compiled (the real SPMD step): whatever the budget, the
    search, which skips what a miss rules out, chooses what compiling every candidate would."""
    kwargs = dict(widths=(8,), pools=(False,), image_size=8, in_channels=2, num_classes=4)  # a block and the head
    model = nnx.eval_shape(lambda: create_model("cifar10dvs_vgg", kwargs, rngs=nnx.Rngs(0)))
    batch = {"inputs": jax.ShapeDtypeStruct(SHAPE, jnp.float32), "labels": jax.ShapeDtypeStruct((16,), jnp.int32)}
    mesh = mesh_lib.make_mesh("stage=2", jax.devices()[:2])
    plan_for = functools.cache(lambda m: parallel.plan(model, mesh, mode="pp", global_batch_size=16,
                                                       pipeline=PipelineOptions("zero_bubble", 1, m, "1|1")))
    compile_for = pm.step_compiler(model, StepConfig(seed=0, time_steps=8, encoder=None), optax.adam(1e-3), batch,
                                   plan_for, lambda plan: {k: plan.batch_sharding(v.ndim, 1 if k == "inputs" else 0)
                                                           for k, v in batch.items()})
    cands = pm.candidates([(m, t) for m, t in pipeline_plan.microbatch_options(16, 1, 2, 1, "zero_bubble")
                           if m in (2, 4)])
    peaks = {c: ms.measure(compile_for, c).peak_bytes for c in cands}
    assert len(cands) == 6 and max(peaks.values()) > min(peaks.values())
    _search_equals_compiling_everything(cands, peaks)
