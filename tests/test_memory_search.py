"""The memory search: estimates from traced programs, candidates fastest first, the first whose compiled peak
fits is chosen, and the analyses it compiles for are those of the real step."""
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from snnjax.models import create_model
from snnjax.train import memory_estimate as me
from snnjax.train import memory_search as ms
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
        a = jnp.sin(x)
        b = jnp.cos(x)
        c = a * b
        return jnp.sum(c)

    jaxpr = jax.make_jaxpr(f)(jnp.zeros(1024, jnp.float32)).jaxpr
    assert me.live_peak(jaxpr) == 4096 * 4  # x, a, b and c while c is written


def test_candidates_start_without_checkpointing_and_recompute_more_and_more(setup):
    _, _, _, _, plans, _ = setup
    assert plans[0].candidate.settings == ms.remat.NONE and plans[0].recompute_flops == 0
    assert plans[1].candidate.settings.spike_residuals == "bits"
    flops = [p.recompute_flops for p in plans]
    assert flops == sorted(flops) and flops[-1] > 0
    assert plans[-1].estimate_bytes < plans[1].estimate_bytes <= plans[0].estimate_bytes
    assert len({p.candidate.describe() for p in plans}) == len(plans)


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
