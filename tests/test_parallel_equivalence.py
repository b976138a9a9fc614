"""Every layout trains exactly like one device (float64), and its compiled step has the collectives it should.

For the spiking MLP and a small CIFAR10DVSVGG under every mode, and a tiny Spikformer under
the modes that split its activations and attention (``SPIKFORMER_MODES``), the first step
must give the single-device loss and gradients, and three Adam steps the same parameters
and BatchNorm statistics (relative error <= 1e-9). One compiled step per (model, mode)
serves both checks and the HLO assertions. The suite runs VGG and Spikformer under a cover of the modes
(``VGG_MODES``, ``SPIKFORMER_MODES``); ``SNNJAX_ALL_CASES=1`` under every one.

The neurons run as the models build them (``impl="auto"``): the fused native kernels, on
one device as they are and under every layout through ``snnjax.neurons.kernels.sharded``, per
device on its shard; each compiled step must contain them (``helpers.neuron_kernels``).

Errors are normwise relative, ``||a - b|| / ||b||``. A conv / linear bias followed by
train-mode BatchNorm has an analytically zero gradient: both sides are rounding noise
there (and Adam turns that noise into ~1e-11 parameter moves), so gradients are
compared per array against ``max(||b||, 1e-3 ||all gradients||)`` and parameters as one
vector.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
import pytest
from helpers import assert_same_training, initial_state, layout_model, neuron_kernels, suite_cases, train_layout

from snnjax import parallel
from snnjax.train.step import StepConfig

MODES = {  # name: (mode, mesh, zero_stage, sequence_parallel)
    "none": ("none", None, None, False),
    "dp": ("dp", "data=8", None, False),
    "dp+zero1": ("dp", "data=8", 1, False),
    "dp+zero2": ("dp", "data=8", 2, False),
    "fsdp": ("fsdp", "fsdp=8", None, False),
    "tp": ("tp", "tensor=8", None, False),
    "fsdp_tp": ("fsdp_tp", "fsdp=4,tensor=2", None, False),
    "dp_tp": ("dp_tp", "data=4,tensor=2", None, False),
    "2x2x2": ("hybrid", "data=2,fsdp=2,tensor=2", 2, False),
}
EXTRA = {"dp_tp+sp": ("dp_tp", "data=4,tensor=2", None, True)}  # sequence parallelism: VGG only (split rows)


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module):  # conftest: jax_enable_x64 for this module, restored after
    yield
    _run.cache_clear()
    _setup.cache_clear()


@functools.cache
def _setup(model_name: str):
    """The model (built once per model), its split state, the optimizer and the batch."""
    return initial_state(*layout_model(model_name))


@functools.cache
def _run(model_name: str, case: str):
    """``(first-step metrics with grads, state after 3 steps, plan, step report)`` of one layout."""
    cfg = StepConfig(seed=0, time_steps=2, encoder=None, compute_dtype=jnp.float64, return_grads=True)
    mode, spec, zero, sp = {**MODES, **EXTRA}[case]
    first, state, plan, compiled, report = train_layout(_setup(model_name), cfg, spec, report=True, mode=mode,
                                                        zero_stage=zero, sequence_parallel=sp)
    report["neuron_kernels"] = neuron_kernels(compiled.as_text())
    return first, state, plan, report


# ZeRO and fsdp shard parameters and optimizer rows whatever the model: Spikformer (the slowest to compile)
# runs the layouts that split its activations and attention (dp, tp and their mixes; fsdp_tp's rule table is
# 2x2x2's, which adds data and ZeRO-2). In the suite: dp (its kernel test below runs it anyway) and 2x2x2, its
# heads split over tensor (SNNJAX_ALL_CASES=1: all four).
SPIKFORMER_MODES = suite_cases(("dp", "tp", "dp_tp", "2x2x2"), ("dp", "2x2x2"))


# ZeRO-1 / ZeRO-2 over dp and plain fsdp shard rows whatever the layers: in the suite the MLP runs them, VGG the
# layouts that split its activations but fsdp_tp, whose rule table 2x2x2 runs with data and ZeRO-2 added (the MLP
# runs fsdp_tp itself; SNNJAX_ALL_CASES=1: VGG under every mode too).
VGG_MODES = suite_cases([c for c in MODES if c != "none"], ["dp", "tp", "dp_tp", "2x2x2"])


@pytest.mark.parametrize("model_name,case", [(m, c) for m in ("mlp", "vgg", "spikformer") for c in MODES
                                             if c != "none" and (m != "spikformer" or c in SPIKFORMER_MODES)
                                             and (m != "vgg" or c in VGG_MODES)]
                         + [("vgg", c) for c in EXTRA])
def test_layout_matches_single_device(model_name, case):
    ref_first, ref_state, _, _ = _run(model_name, "none")
    first, state, plan, report = _run(model_name, case)
    assert_same_training(first, state, ref_first, ref_state)

    _check_collectives(model_name, case, plan, report)
    _check_neuron_kernels(model_name, plan, report)


def _check_neuron_kernels(model_name, plan, report):
    """The fused kernels run under the layout, each on at most its device's share of the batch (no gather)."""
    ref, got = _run(model_name, "none")[3]["neuron_kernels"], report["neuron_kernels"]
    assert set(ref) == set(got) == {"SnnNeuronForwardF64", "SnnNeuronBackwardF64"}, (ref, got)
    shards = plan.axis_sizes["data"] * plan.axis_sizes["fsdp"]
    for target, ms in got.items():  # sorted sizes: a per-layer bound implies this elementwise bound
        assert len(ms) == len(ref[target]) and all(m * shards <= r for m, r in zip(ms, ref[target], strict=True)), \
            (target, ms, ref[target])


def _check_collectives(model_name, case, plan, report):
    """Each strategy's signature in the compiled HLO (bytes are per device, float64)."""
    c = report["collectives"]
    mode, _, zero, sp = {**MODES, **EXTRA}[case]
    param_bytes = sum(p.bytes for p in plan.params)
    # bytes of the parameters FSDP / ZeRO can split 8 (or 4 / 2) ways: nearly all of them
    split = sum(p.bytes for p in plan.params if p.layout.param != p.layout.compute or p.layout.opt != p.layout.param)
    reduce_scatter = c["reduce-scatter"]["bytes"] + c["all-reduce+slice"]["bytes"]
    if mode == "dp" and not zero:
        # the gradient all-reduce carries every parameter; nothing is gathered
        assert c["all-reduce"]["bytes"] >= param_bytes, c
        assert c["all-gather"]["count"] == 0, c
    # the plan's per-device bytes are what the sharded arrays hold (Adam: 2 slots plus a step count)
    totals = plan.totals()
    assert report["param_bytes"] == totals["param_bytes_per_device"]
    assert 0 <= report["optimizer_bytes"] - totals["optimizer_bytes_per_device"] <= 16
    shards = plan.axis_sizes["data"] * plan.axis_sizes["fsdp"]
    if zero or plan.strategy.fsdp:  # optimizer state split over data x fsdp
        assert report["optimizer_bytes"] <= 1.3 * 2 * param_bytes / shards
    if zero:
        # the optimizer state is split over data, so updated parameters are all-gathered from their shards
        assert c["all-gather"]["bytes"] >= 0.9 * split / (2 if mode == "hybrid" else 1), c
    if zero == 2 or plan.strategy.fsdp:
        # gradients are reduced to their shards (XLA:CPU: all-reduce + slice; GPU/TPU fuse it to reduce-scatter)
        assert reduce_scatter >= 0.5 * split / 2, c
    if plan.strategy.fsdp:
        assert c["all-gather"]["count"] > 0, c  # parameters gathered for the forward
        assert report["param_bytes"] <= 1.3 * param_bytes / plan.axis_sizes["fsdp"] + 0.1 * param_bytes
    if plan.strategy.tensor:
        rows = sum(1 for lay in parallel.analyze(_setup(model_name)[0])["tp_layers"] if lay["role"] == "row")
        assert c["all-reduce"]["count"] >= rows, c  # one per row-parallel layer (activation-sized)
    if mode == "tp":
        assert c["all-gather"]["count"] == 0 and c["all-reduce+slice"]["count"] == 0, c  # nothing gathered
        assert report["param_bytes"] < 0.8 * param_bytes
    if sp:  # row-parallel outputs are reduce-scattered over rows and gathered again: less activation memory
        assert c["all-gather"]["count"] > 0 and c["all-reduce+slice"]["count"] > 0, c
        assert report["activation_bytes"] < _run(model_name, "dp_tp")[3]["activation_bytes"]


@pytest.mark.parametrize("model_name", ["mlp", "vgg", "spikformer"])
def test_dp_runs_the_fused_kernels_on_each_devices_batch_shard(model_name):
    """parallel.mode=dp over data=8: every neuron kernel call takes an eighth of the neurons, nothing is gathered."""
    _, _, _, report = _run(model_name, "dp")
    ref, got = _run(model_name, "none")[3]["neuron_kernels"], report["neuron_kernels"]
    assert got == {target: [m // 8 for m in ms] for target, ms in ref.items()}, (got, ref)
    assert report["collectives"]["all-gather"]["count"] == 0, report["collectives"]


@pytest.mark.parametrize("model_name", ["mlp", "vgg", "spikformer"])
def test_single_device_has_no_collectives(model_name):
    _, _, _, report = _run(model_name, "none")
    assert all(v["count"] == 0 for v in report["collectives"].values())


def test_tp_all_reduces_carry_activations():
    """Under pure TP the all-reduces are activations (no gradient all-reduce: the batch is not split)."""
    _, _, plan, report = _run("vgg", "tp")
    # VGG: 4 row-parallel convs; their outputs [T, N, H, W, C] are far larger than any parameter here
    largest_param = max(p.bytes for p in plan.params)
    assert report["collectives"]["all-reduce"]["bytes"] > 4 * largest_param
