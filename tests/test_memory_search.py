"""The memory search picks the first candidate whose compiled peak fits the budget, and says so."""
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from snnjax.models import create_model
from snnjax.train import memory_search as ms
from snnjax.train.step import StepConfig


@pytest.fixture(scope="module")
def compile_for(x32_module):
    kwargs = dict(widths=(8, 8, 16), pools=(False, True, False), image_size=8, in_channels=2, num_classes=4)
    model = nnx.eval_shape(lambda: create_model("cifar10dvs_vgg", kwargs, rngs=nnx.Rngs(0)))
    batch = {"inputs": jax.ShapeDtypeStruct((8, 16, 8, 8, 2), jnp.float32),
             "labels": jax.ShapeDtypeStruct((16,), jnp.int32)}
    return ms.step_compiler(model, StepConfig(seed=0, time_steps=8, encoder=None), optax.adam(1e-3), batch)


def test_search_fits_the_budget(compile_for):
    first = ms.measure(compile_for, ms.CANDIDATES[0])
    smallest = min(ms.measure(compile_for, c).peak_bytes for c in ms.CANDIDATES)
    assert smallest < first.peak_bytes
    budget = (smallest + first.peak_bytes) // 2
    result = ms.search(compile_for, budget)
    assert result.chosen is not None and result.chosen.peak_bytes <= budget
    assert all(m.peak_bytes > budget for m in result.tried[:-1])
    assert result.optimize_ms > 0 and "chosen: " + result.chosen.candidate.describe() in result.summary()


def test_search_reports_when_nothing_fits(compile_for):
    result = ms.search(compile_for, 1)
    assert result.chosen is None and len(result.tried) == len(ms.CANDIDATES)
    assert "nothing fits" in result.summary()
