"""Layouts composed with each other do what the plan says (float64, against one device).

* A pipeline over ``stage`` with ``time`` inside: each stage's neurons pipeline their time steps over
  ``time`` (no activation is gathered over T), and training equals one device.
* The fused native neuron kernels run per device inside the pipeline's stages (data or tensor inside a
  stage) and in the time split with data, on each device's share of the neurons.
* ZeRO inside the pipeline: ``zero_stage=2`` splits each stage row's optimizer state (and gradients) over
  the stage's data axis.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import BATCH, assert_same_training, flat, gathered_dims, initial_state, neuron_kernels, train_layout

from snnjax.models import CIFAR10DVSVGG, SpikingMLP
from snnjax.neurons import set_impl
from snnjax.neurons.kernels import temporal as neuron_temporal
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train.step import StepConfig

T = 6  # no other dim of the test's arrays has this size: a gather over T is recognisable in the HLO


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module):
    yield
    _run.cache_clear()


def build(name: str, impl: str):
    kw = dict(rngs=nnx.Rngs(params=0, dropout=1), dtype=jnp.float64, param_dtype=jnp.float64)
    if name == "mlp":  # 3 units: two hidden layers and the head
        model, shape = SpikingMLP(16, (16, 16), 10, batch_norm=True, **kw), (T, BATCH, 4, 4, 1)
    else:  # 5 units: 4 blocks (column- and row-parallel convolutions in turn, the last pair the smallest), the head
        model = CIFAR10DVSVGG(widths=(8, 8, 8, 8), pools=(False, False, True, False), image_size=16, dropout=0.0,
                              **kw)
        shape = (2, BATCH, 16, 16, 2)
    set_impl(model, impl)
    return model, shape


@functools.cache
def _run(name: str, mesh_spec: str | None, mode: str, microbatches: int = 1, impl: str = "auto",
         zero_stage: int | None = None):
    """``(first-step metrics, state after 3 steps, plan, compiled HLO text, neuron schedules traced, step report
    with the state's per-device bytes)``."""
    setup = initial_state(*build(name, impl))
    time_steps = setup[4].shape[0]
    cfg = StepConfig(seed=0, time_steps=time_steps, encoder=None, compute_dtype=jnp.float64, return_grads=True,
                     grad_accum_steps=microbatches if mesh_spec is None else 1)
    pipeline = PipelineOptions("1f1b", 1, microbatches) if mode == "pp" else None
    with neuron_temporal.recording() as schedules:
        first, state, plan, compiled, report = train_layout(
            setup, cfg, mesh_spec, report=True, mode=mode, global_batch_size=BATCH, pipeline=pipeline,
            zero_stage=zero_stage, time_steps=time_steps)
    return first, state, plan, compiled.as_text(), list(schedules), report


def _assert_equal_to_one_device(name, first, state, microbatches=1, impl="auto"):
    ref_first, ref_state, *_ = _run(name, None, "none", microbatches, impl)
    assert_same_training(first, state, ref_first, ref_state)


def test_pipeline_with_time_splits_each_stage_time_steps():
    """pp on stage=2 x time=2 x data=2: the neurons inside each stage run the time pipeline (T/2 steps per
    device, potentials passed between time devices), nothing is gathered over T, and training equals one
    device (1f1b, 2 microbatches)."""
    first, state, plan, hlo, schedules, _ = _run("mlp", "stage=2,time=2,data=2", "pp", 2)
    assert plan.mode == "pp" and plan.temporal["time_shards"] == 2
    assert schedules and all(s.shards == 2 for _, s in schedules), schedules  # every neuron call split T
    assert T not in [size for _, size in gathered_dims(hlo)], [ln for ln in hlo.splitlines() if "all-gather(" in ln]
    _assert_equal_to_one_device("mlp", first, state, 2)


@pytest.mark.parametrize("mesh_spec,mode,shards", [("stage=2,data=4", "pp", 4), ("stage=2,tensor=2", "pp", 2),
                                                   ("time=2,data=4", "dp", 8)])
def test_fused_kernels_run_per_device_inside_composed_layouts(mesh_spec, mode, shards):
    """The native kernels, not the ``xla`` path, and each call on at most its device's share of the neurons:
    inside a pipeline stage with data or tensor left to the partitioner, and per time block with data. (Against
    one device with the same microbatches; under tensor parallelism only the column-parallel layers' neurons
    are split, the others replicated, so there the smallest call must be split.)"""
    impl = "native" if "time" in mesh_spec else "auto"  # the time split's blocks take the kernel when asked
    microbatches = 2 if mode == "pp" else 1
    first, state, plan, hlo, _, _ = _run("vgg", mesh_spec, mode, microbatches, impl)
    ref_hlo = _run("vgg", None, "none", microbatches, impl)[3]
    got, ref = neuron_kernels(hlo), neuron_kernels(ref_hlo)
    assert set(got) == {"SnnNeuronForwardF64", "SnnNeuronBackwardF64"}, got
    calls, ref_calls = got["SnnNeuronForwardF64"], ref["SnnNeuronForwardF64"]
    if "tensor" in mesh_spec:
        assert min(calls) * shards <= min(ref_calls) and max(calls) <= max(ref_calls), (got, ref)
    else:
        assert max(calls) * shards <= max(ref_calls), (got, ref)
    _assert_equal_to_one_device("vgg", first, state, microbatches, impl)


def test_zero_inside_the_pipeline_splits_the_optimizer_rows_over_data():
    first, state, plan, _, _, report = _run("vgg", "stage=2,data=4", "pp", 2, "auto", 2)
    _, _, base, _, _, base_report = _run("vgg", "stage=2,data=4", "pp", 2)
    zero, plain = plan.totals(), base.totals()
    assert zero["optimizer_bytes_per_device"] <= 1.05 * plain["optimizer_bytes_per_device"] / 4, (zero, plain)
    assert zero["grad_bytes_per_device"] <= 1.05 * plain["grad_bytes_per_device"] / 4
    # what the trained state's arrays hold per device (Adam's two slots and its step count)
    assert report["optimizer_bytes"] <= 1.05 * base_report["optimizer_bytes"] / 4, (report, base_report)
    assert plan.row_sharding("opt").spec == jax.sharding.PartitionSpec("stage", ("data",))
    _assert_equal_to_one_device("vgg", first, state, 2)


def test_pipeline_in_bfloat16_follows_float32():
    """pp on stage=2 x data=4 computing in bfloat16 (float32 parameters) stays close to one float32 device: spikes
    are discontinuous, so the check is loose (the loss to 2%, the gradient's direction)."""
    def run(mesh_spec, dtype):
        kw = dict(rngs=nnx.Rngs(params=0, dropout=1), dtype=dtype, param_dtype=jnp.float32)
        model = SpikingMLP(16, (32, 32), 10, batch_norm=True, **kw)
        model, graphdef, tx, host_state, x, y = initial_state(model, (4, BATCH, 4, 4, 1))
        cfg = StepConfig(seed=0, time_steps=4, encoder=None, compute_dtype=dtype, return_grads=True,
                         grad_accum_steps=1 if mesh_spec else 2)
        first, *_ = train_layout((model, graphdef, tx, host_state, x.astype(jnp.float32), y), cfg, mesh_spec,
                                 mode="pp", global_batch_size=BATCH, pipeline=PipelineOptions("1f1b", 1, 2))
        return float(first["loss"]), flat(first["grads"])

    loss, grads = run("stage=2,data=4", jnp.bfloat16)
    ref_loss, ref_grads = run(None, jnp.float32)
    assert abs(loss - ref_loss) <= 0.02 * abs(ref_loss), (loss, ref_loss)
    cosine = grads @ ref_grads / (np.linalg.norm(grads) * np.linalg.norm(ref_grads))
    assert cosine > 0.95, cosine
