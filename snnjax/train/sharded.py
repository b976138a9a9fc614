"""The train and eval steps jitted under a parallel plan: ``apply_plan`` and ``eval_fn``.

    p = snnjax.parallel.plan(model, mesh, mode="fsdp")
    state, step = apply_plan(p, state, step_cfg, graphdef, tx)
    state, metrics = step(state, batch)
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import optax
from flax import nnx

from snnjax.layers.conv_cpu import compiler_options
from snnjax.parallel.plan import Plan
from snnjax.train import offload as offload_lib
from snnjax.train.step import StepConfig, TrainState, eval_step, train_step


def apply_plan(p: Plan, state: TrainState, cfg: StepConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               *, batch_axes: Mapping[str, int] | None = None, batch_ndims: Mapping[str, int] | None = None,
               donate: bool = True, offload: str = "none"):
    """Shard ``state`` as ``p`` says; returns ``(state, step)``, ``step`` the jitted
    ``train_step(cfg, graphdef, tx, ...)`` with the plan's in/out shardings.

    ``batch_axes`` / ``batch_ndims``: each batch entry's batch axis and rank (e.g. ``{"inputs": 1,
    "labels": 0}`` and ``{"inputs": 5, "labels": 1}``) to fix the batch's input shardings; without them
    the batch keeps the shardings it arrives with (``plan.batch_sharding`` builds them).
    With ``donate`` (default) each step reuses its input state's buffers; arrays of ``state`` that
    ``device_put`` did not need to move are donated too, so do not reuse ``state`` after the first step.
    ``offload``: what lives in host memory between steps (``snnjax.train.offload``): ``opt_state``, ``params``
    (each model unit's parameters fetched to the device when the unit runs; ``Plan.with_offload``) or ``all``;
    ``"none"`` keeps the plan's own (``p.offload``)
    Under a pipeline plan the returned state holds the parameters packed per device (``plan.packing``;
    ``plan.packing.unpack_state`` gives back the tree).
    """
    if p.packing is not None and not p.packing.is_packed(state.params):  # pipeline: each device its stages' rows
        state = p.packing.pack_state(state)
    batch_sh = None
    if batch_axes is not None:
        if batch_ndims is None or set(batch_ndims) != set(batch_axes):
            raise ValueError("give batch_ndims for the same keys as batch_axes")
        batch_sh = {k: p.batch_sharding(batch_ndims[k], batch_axes[k]) for k in batch_axes}
    shardings, step = plan_step(p, state, cfg, graphdef, tx, batch_shardings=batch_sh, donate=donate, offload=offload)
    return jax.device_put(state, shardings), step


def plan_step(p: Plan, state, cfg: StepConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation, *,
              batch_shardings=None, donate: bool = True, offload: str = "none", compiler_options=None):
    """``(state shardings, jitted step)`` for ``state`` (arrays or ``jax.ShapeDtypeStruct``, in the plan's own
    form: packed under a pipeline) as ``apply_plan`` builds them; ``compiler_options`` are added to the plan's."""
    p = p.with_offload(offload) if offload != "none" else p
    offload = p.offload
    offload_lib.require_host_memory(offload)
    shardings = offload_lib.host_opt_state(p.state_shardings(state, tx), offload)
    step_fn = functools.partial(train_step, cfg, graphdef, tx, layout=p.step_layout(state.params))
    step = jax.jit(offload_lib.wrap_step(step_fn, offload),
                   in_shardings=(shardings, batch_shardings), out_shardings=(shardings, None),
                   donate_argnums=(0,) if donate else (),
                   compiler_options={**(_compiler_options(p, state, cfg) or {}), **(compiler_options or {})} or None)
    return shardings, step


def eval_fn(p: Plan, state: TrainState, cfg: StepConfig, graphdef: nnx.GraphDef):
    """The jitted ``eval_step`` under plan ``p`` (parameters gathered as in training; parameters in host memory
    are fetched unit by unit, as ``Plan.with_offload`` says)."""
    on_host = {getattr(getattr(x, "sharding", None), "memory_kind", None) for x in jax.tree.leaves(state.params)}
    if offload_lib.HOST_KIND in on_host and not p.streams_params:
        p = p.with_offload("params")
    return jax.jit(functools.partial(eval_step, cfg, graphdef, layout=p.step_layout(state.params)),
                   compiler_options=_compiler_options(p, state, cfg))


def _compiler_options(p: Plan, state, cfg: StepConfig) -> dict[str, str] | None:
    """XLA options for the step of ``state`` in ``cfg.compute_dtype`` on the plan's devices (the convolution
    runtime on CPUs, by dtype: ``conv_cpu.compiler_options``)."""
    return compiler_options((state, cfg.compute_dtype), p.mesh.devices.flat[0].platform if p.mesh is not None else None)
