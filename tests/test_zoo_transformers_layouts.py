"""Spike-Driven Transformer and QKFormer train under every layout exactly as on one device (float64).

Tiny widths, T=2, 8 examples, each architecture with one of every unit kind (SDT: three patch stages,
the final stage, one block, the head; QKFormer: its three patch embeddings, a Q-K attention block in
the first stage and a self-attention block in the third), BatchNorm scaled and shifted so every layer
fires: dp (``data=8``), fsdp_tp (``fsdp=4,tensor=2``: whole heads on ``tensor``), the 1F1B pipeline
over ``stage=2`` with data and tensor inside each stage (2 microbatches; its reference accumulates the
same 2 microbatches on one device), and temporal parallelism with data and tensor
(``time=2,data=2,tensor=2``). The first step's loss and gradients, and the parameters, optimizer state
and BatchNorm statistics after three Adam steps, must equal one device's (relative error <= 1e-9,
compared by ``helpers.assert_same_training``). The same one-device reference checks activation
checkpointing: every unit under ``remat=spikes`` with spikes kept as bits gives its first step's loss
and gradients. Programs compile with ``conftest.quick_compiles``. The suite runs each model under two of the
layouts, each layout once; ``SNNJAX_ALL_CASES=1`` every pair.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import BATCH, assert_same_training, initial_state, suite_cases, train_layout

from snnjax import layers
from snnjax.models import QKFormer, SpikeDrivenTransformer, remat
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.train.step import StepConfig

LAYOUTS = {  # name: (mode (None: the one the mesh implies), mesh, microbatches)
    "dp": ("dp", "data=8", 1),
    "fsdp_tp": ("fsdp_tp", "fsdp=4,tensor=2", 1),
    "pp_data_tensor": ("pp", "stage=2,data=2,tensor=2", 2),
    "time_data_tensor": (None, "time=2,data=2,tensor=2", 1),
}


@pytest.fixture(scope="module", autouse=True)
def _float64(x64_module, quick_compiles_module):
    yield
    _run.cache_clear()
    _setup.cache_clear()


def build(name: str) -> nnx.Module:
    kw = dict(T=2, in_channels=2, num_classes=10, rngs=nnx.Rngs(0), dtype=jnp.float64, param_dtype=jnp.float64)
    if name == "sdt":  # 6 units; 2 heads of 8 channels, mlp_ratio 1 (the MLP's inner shortcut)
        model = SpikeDrivenTransformer(embed_dims=16, num_heads=2, depths=1, mlp_ratio=1.0, pooling_stat="1100",
                                       **kw)
    else:  # 6 units: no block in the second stage (its Q-K attention is the first stage's at another width)
        model = QKFormer(embed_dims=16, num_heads=(2, 2, 2), depths=(1, 0, 1), mlp_ratio=2.0, **kw)
    for _, m in nnx.iter_modules(model):  # BatchNorm scales and shifts that make every layer fire
        if isinstance(m, layers.BatchNorm):
            m.scale[...], m.bias[...] = 1.5 * m.scale[...], m.bias[...] + 0.3
    return model


@functools.cache
def _setup(name: str, checkpointed: bool = False):
    model = build(name)
    if checkpointed:
        remat.configure(model, remat="spikes", spike_residuals="bits")
    return initial_state(model, (2, BATCH, 16, 16, 2))


@functools.cache
def _run(name: str, layout: str | None, microbatches: int = 1, checkpointed: bool = False):
    """``(first-step metrics with grads, state after 3 steps)``; layout None: one device."""
    accum = microbatches if layout is None else 1
    cfg = StepConfig(seed=0, time_steps=2, encoder=None, compute_dtype=jnp.float64, return_grads=True,
                     grad_accum_steps=accum)
    mode, spec, m = LAYOUTS.get(layout, (None, None, 1))
    pp = dict(global_batch_size=BATCH, pipeline=PipelineOptions("1f1b", 1, m)) if mode == "pp" else {}
    first, state, *_ = train_layout(_setup(name, checkpointed), cfg, spec, mode=mode, **pp)
    return first, state


# The suite's cover: each model under two layouts, each layout once (SNNJAX_ALL_CASES=1: each pair).
@pytest.mark.parametrize("name,layout", suite_cases(
    [(name, layout) for layout in LAYOUTS for name in ("sdt", "qkformer")],
    [("qkformer", "fsdp_tp"), ("qkformer", "time_data_tensor"), ("sdt", "dp"), ("sdt", "pp_data_tensor")]))
def test_layout_matches_single_device(name, layout):
    (first, state), (ref_first, ref_state) = _run(name, layout), _run(name, None, LAYOUTS[layout][2])
    assert_same_training(first, state, ref_first, ref_state)


@pytest.mark.parametrize("name", ["sdt", "qkformer"])
def test_checkpointing_and_bit_spikes_keep_loss_and_gradients(name):
    """``remat=spikes`` with ``spike_residuals=bits`` (every layer after a neuron keeps its input as bits or int8)
    recomputes the rest: the first train step on one device gives the loss and gradients of the reference above."""
    (ref, _), (got, _) = _run(name, None, 1), _run(name, None, 1, True)  # the same reference as above
    assert float(ref["loss"]) != 0 and abs(float(got["loss"]) - float(ref["loss"])) <= 1e-12 * abs(float(ref["loss"]))
    for g, r in zip(jax.tree.leaves(got["grads"]), jax.tree.leaves(ref["grads"]), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-9, atol=1e-12)
