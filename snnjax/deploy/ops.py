"""Primitive inference ops: a trained model as a flat chain, for streaming, energy counts and NIR.

``snnjax.deploy.graph.layer_ops(model)`` describes a supported model as the ops its eval-mode
forward applies, in order:

- ``flatten``: ``[N, H, W, C] -> [N, H*W*C]`` (HWC order, or a ``layers.Flatten``'s own order);
- ``linear`` (``nnx.Linear``, kernel ``[in, out]``): ``[N, in] -> [N, out]``;
- ``conv`` (``layers.Conv2d``, kernel ``[kh, kw, I, O]``): ``[N, H, W, I] -> [N, H', W', O]``;
- ``batchnorm`` (``layers.BatchNorm``, eval mode: running statistics): per channel, last axis;
- ``avgpool`` / ``maxpool`` (window = stride = ``size``): ``[N, H, W, C] -> [N, H/k, W/k, C]``;
- ``dropout``: the identity at inference;
- ``neuron`` (``IFNode``, ``LIFNode``, ``ParametricLIFNode``): spikes, the state ``V`` carried over time.

(shapes of one time step ``[N, ...]``). ``run_ops`` applies them over a whole sequence ``[T, N, ...]``
(stateless ops once on every step, neurons through their multi-step forward), equal to the model's
own eval-mode call; ``step_ops`` applies them to one time step with explicit neuron states.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax import layers
from snnjax.neurons.base import state_dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Op:
    """One primitive op: ``kind`` (one of ``snnjax.models.sequential.KINDS``), its ``name`` (the model's attribute
    path, e.g. ``"features.3.conv"``), the ``module`` holding its parameters (None for parameter-free ops; a
    ``flatten``'s ``layers.Flatten`` gives its order) and ``size`` (pooling window and stride)."""

    kind: str
    name: str
    module: nnx.Module | None = None
    size: int = 0


def apply_stateless(op: Op, x: jax.Array, lead: int) -> jax.Array:
    """A stateless op on ``x`` with ``lead`` leading batch-like axes (2: ``[T, N, ...]``, 1: ``[N, ...]``)."""
    if op.kind == "flatten":
        return layers.flatten_features(x, lead, "hwc" if op.module is None else op.module.order)
    if op.kind in ("linear", "conv", "batchnorm"):
        return op.module(x)
    if op.kind == "avgpool":
        return layers.avg_pool2d(x, op.size)
    if op.kind == "maxpool":
        return layers.max_pool2d(x, op.size)
    if op.kind == "dropout":
        return x
    raise ValueError(f"op {op.name!r} of kind {op.kind!r} is not stateless")


def run_ops(ops: Sequence[Op], x: jax.Array, *, record: Callable[[Op, jax.Array, jax.Array], None] | None = None
            ) -> jax.Array:
    """``x [T, N, ...]`` through ``ops`` (eval mode: BatchNorm must use its running statistics).

    ``record(op, inputs, outputs)``, if given, is called for every op (inside a trace: with tracers).
    """
    for op in ops:
        y = op.module.multi_step(x)[0] if op.kind == "neuron" else apply_stateless(op, x, 2)
        if record is not None:
            record(op, x, y)
        x = y
    return x


def initial_states(ops: Sequence[Op], frame: jax.ShapeDtypeStruct) -> list[jax.Array]:
    """Fresh neuron states (one per ``neuron`` op, its input's shape) for one step's input ``frame`` ``[N, ...]``."""
    shapes = jax.eval_shape(lambda x: _neuron_inputs(ops, x), frame)
    return [jnp.full(s.shape, 0.0 if op.module.v_reset is None else op.module.v_reset,
                     dtype=state_dtype(s.dtype))
            for op, s in zip((o for o in ops if o.kind == "neuron"), shapes, strict=True)]


def _neuron_inputs(ops, x):
    found = []
    for op in ops:
        if op.kind == "neuron":
            found.append(x)
        else:
            x = apply_stateless(op, x, 1)
    return found


def step_ops(ops: Sequence[Op], x: jax.Array, states: Sequence[jax.Array], *,
             record: Callable[[Op, jax.Array, jax.Array], None] | None = None) -> tuple[jax.Array, list[jax.Array]]:
    """One time step ``x [N, ...]`` through ``ops`` from neuron ``states``: ``(output, new states)``."""
    new, it = [], iter(states)
    for op in ops:
        if op.kind == "neuron":
            y, v = op.module.step(x, next(it))
            new.append(v)
        else:
            y = apply_stateless(op, x, 1)
        if record is not None:
            record(op, x, y)
        x = y
    return x, new


def neuron_ops(ops: Sequence[Op]) -> list[Op]:
    """The ``neuron`` ops of ``ops``, in order."""
    return [op for op in ops if op.kind == "neuron"]
