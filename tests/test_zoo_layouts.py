"""The model zoo under every kind of layout trains exactly like one device (float64, 8 host devices).

One small model per family (SEW-ResNet with PLIF neurons, a parametric-LIF voting net with
shared-over-time dropout and the MSE rate loss, MS-ResNet with its LIF and Rect surrogate), each trained
three Adam steps under dp, fsdp_tp, a 1F1B pipeline over stage=2 with data x tensor inside (against one
device with the same microbatching), and time x data x tensor: the first step's loss and gradients and
the parameters, optimizer state and BatchNorm statistics after three steps equal one device's
(relative error <= 1e-9, compared by ``helpers.assert_same_training``). Per-unit activation
checkpointing keeps each family's loss and gradients. The suite runs a cover of these pairs (each layout once, each
family at least once, each checkpointing policy once); ``SNNJAX_ALL_CASES=1`` every pair. Programs compile with
``conftest.quick_compiles``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import BATCH, assert_same_training, initial_state, suite_cases, train_layout

from snnjax.models import MSResNet, ParametricLIFNet, ResNet, remat
from snnjax.neurons import ATan, ParametricLIFNode
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train.step import StepConfig

SHAPE = (2, BATCH, 16, 16, 2)
MICROBATCHES = 2
# per-unit checkpoint policy and spike storage
CHECKPOINTING = {"sew_resnet": ("units", "int8"), "plif_net": ("units", "int8"), "ms_resnet": ("spikes", "bits")}


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module, quick_compiles_module):
    yield
    _run.cache_clear()
    _setup.cache_clear()


_PLIF = dict(spiking_neuron=ParametricLIFNode, detach_reset=True, surrogate_function=ATan())


def build(family: str):
    kw = dict(rngs=nnx.Rngs(params=0, dropout=1), dtype=jnp.float64, param_dtype=jnp.float64)
    if family == "plif_net":
        model = ParametricLIFNet(stages=2, channels=4, hidden_features=8, image_size=16, num_classes=10,
                                 voting_size=2, dropout=0.25, **_PLIF, **kw)
        model.fc1.kernel[...] = 3.0 * model.fc1.kernel[...]  # the 8-unit hidden layer fires: no gradient is zero
        return model
    if family == "ms_resnet":  # 3 stages of 4, 8, 16 channels: stem, 3 blocks, head
        model = MSResNet(T=2, layers=(1, 1, 1), base_channels=4, stem_kernel_size=3, stem_stride=1,
                         in_channels=2, num_classes=10, **kw)
        for stage in model.stages():  # not zero-initialised: the first step's gradients reach every block's convs
            for blk in stage:
                blk.bn2.scale[...] = jnp.full_like(blk.bn2.scale[...], 0.5)
        return model
    return ResNet(depth=18, cnf="ADD", widths=(4, 4, 8, 8), stage_blocks=(1, 1, 1, 1), in_channels=2,
                  num_classes=10, **_PLIF, **kw)


@functools.cache
def _setup(family: str, checkpointed: bool = False):
    model = build(family)
    if checkpointed:
        remat.configure(model, *CHECKPOINTING[family])
    return initial_state(model, SHAPE)


@functools.cache
def _run(family: str, layout: str | None, accum: int = 1, checkpointed: bool = False):
    """``(first-step metrics with grads, state after 3 steps)`` under ``layout`` (None: one device)."""
    loss = "mse" if family == "plif_net" else "ce"
    cfg = StepConfig(seed=0, time_steps=2, encoder=None, compute_dtype=jnp.float64, return_grads=True, loss=loss,
                     grad_accum_steps=accum)
    spec, _, mode = (layout or "").partition(":")
    pp = dict(global_batch_size=BATCH, pipeline=PipelineOptions("1f1b", 1, MICROBATCHES)) if mode == "pp" else {}
    first, state, *_ = train_layout(_setup(family, checkpointed), cfg, spec or None, mode=mode or None, **pp)
    return first, state


# pp and the time split each with data x tensor inside (the combination), besides dp and fsdp_tp.
LAYOUTS = ["data=8:dp", "fsdp=4,tensor=2:fsdp_tp", "stage=2,data=2,tensor=2:pp", "time=2,data=2,tensor=2"]
# The suite's cover: every layout once, every family at least once (the voting net also under the time split, which
# its shared-over-time dropout meets; MS-ResNet's membrane shortcut with its channels over tensor; SEW-ResNet's
# residual stages as pipeline units). SNNJAX_ALL_CASES=1: each pair.
CASES = suite_cases([(f, layout) for f in ("sew_resnet", "plif_net", "ms_resnet") for layout in LAYOUTS],
                    [("sew_resnet", LAYOUTS[2]), ("plif_net", LAYOUTS[0]), ("plif_net", LAYOUTS[3]),
                     ("ms_resnet", LAYOUTS[1])])


@pytest.mark.parametrize("family,layout", CASES)
def test_layout_matches_single_device(family, layout):
    pp = layout.endswith(":pp")
    (ref_first, ref_state), (first, state) = _run(family, None, MICROBATCHES if pp else 1), _run(family, layout)
    assert float(jnp.abs(ref_first["loss"])) > 0
    assert_same_training(first, state, ref_first, ref_state)


@pytest.mark.parametrize("family", suite_cases(list(CHECKPOINTING), ["sew_resnet", "ms_resnet"]))  # both policies
def test_units_checkpointing_keeps_the_loss_and_gradients(family):
    """Per-unit activation checkpointing (``remat``, spikes kept compressed): the first train step on one device
    (train-mode BatchNorm, dropout on) gives the loss and gradients of the reference above, every gradient non-zero
    (the neurons fire: a change would show)."""
    (ref, _), (got, _) = _run(family, None, 1), _run(family, None, 1, True)  # the same reference as above
    ref_grads = jax.tree.leaves(ref["grads"])
    assert all(float(np.abs(r).sum()) > 0 for r in ref_grads), "a gradient is zero: the test would not see a change"
    np.testing.assert_allclose(float(got["loss"]), float(ref["loss"]), rtol=1e-12)
    for g, r in zip(jax.tree.leaves(got["grads"]), ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-12, atol=1e-14)
