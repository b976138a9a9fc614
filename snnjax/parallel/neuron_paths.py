"""Which path runs each neuron of a model under a plan's mesh, and why: what ``print(plan)`` says of the neurons.

``trace`` runs the model on its batch ``[T, N, ...]`` for shapes only (``jax.eval_shape``: no devices) under an
abstract mesh of the plan's axis sizes, and records each multi-step neuron call's choice
(``snnjax.neurons.choose_impl``: the path and why, under the layout and the time split) and, where the mesh
splits ``time``, its pipeline schedule (``snnjax.neurons.kernels.temporal``). The ``stage`` axis is left out:
inside a pipeline's stages it is manual, and the neurons see the other axes only. ``summary`` groups the choices
per neuron type. The same trace records each CPU convolution's path (``conv_paths``), which the plan prints
beside the neurons'.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh, AxisType

from snnjax.neurons.kernels import dispatch
from snnjax.neurons.kernels import temporal as neuron_temporal
from snnjax.parallel import conv_paths


def trace(model: nnx.Module, input_shape: tuple[int, ...], axis_sizes: Mapping[str, int], dtype=jnp.float32,
          time_blocks: int = 0) -> tuple[list, list, list]:
    """``(choices, schedules, convolutions)`` of ``model`` on inputs of ``input_shape`` in ``dtype`` under a mesh of
    ``axis_sizes``: ``(neuron name, input shape, dispatch.Choice)`` per multi-step neuron call, ``(input shape,
    temporal.Schedule)`` per time-split call and ``conv_paths.record``'s tuple per CPU convolution, in call order.

    Raises ValueError naming the neuron layer (in call order) whose dims no ``time_blocks`` count divides.
    """
    sizes = {a: int(n) for a, n in axis_sizes.items() if n > 1 and a != "stage"}
    mesh = AbstractMesh(tuple(sizes.values()), tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes))
    graphdef, state = nnx.split(model)

    def run(state, x):
        return nnx.merge(graphdef, state)(x)

    with dispatch.recording() as choices, neuron_temporal.recording() as schedules, conv_paths.recording() as convs, \
            conv_paths.planned_devices(math.prod(axis_sizes.values())), jax.sharding.use_abstract_mesh(mesh), \
            neuron_temporal.block_count(time_blocks):
        try:
            jax.eval_shape(run, state, jax.ShapeDtypeStruct(tuple(input_shape), dtype))
        except ValueError as e:
            if "time_blocks" not in str(e):
                raise
            layer = str(e).removeprefix("the neuron layer ")
            raise ValueError(f"{type(model).__name__}'s neuron layer {len(schedules) + 1} (in call order) "
                             f"{layer}") from None
    return choices, schedules, convs


def summary(model: nnx.Module, input_shape: tuple[int, ...], axis_sizes: Mapping[str, int], dtype=jnp.float32,
            time_blocks: int = 0) -> tuple[list[dict], list[dict]]:
    """``(neurons, convolutions)``: one entry per neuron type and path, in call order, ``{"neuron", "layers",
    "impl", "why"}`` (``trace``'s choices; ``layers``: how many neuron calls of that type take that path for that
    reason), and ``conv_paths.summary``'s rows."""
    choices, _, convs = trace(model, input_shape, axis_sizes, dtype, time_blocks)
    rows: dict[tuple, dict] = {}
    for name, _, choice in choices:
        row = rows.setdefault((name, choice.impl, choice.why),
                              {"neuron": name, "layers": 0, "impl": choice.impl, "why": choice.why})
        row["layers"] += 1
    return list(rows.values()), conv_paths.summary(convs)


def describe(rows: list[dict]) -> list[str]:
    """``print(plan)``'s lines for ``summary``'s rows."""
    return [f"  neurons {r['neuron']} ({r['layers']} layer{'s' if r['layers'] > 1 else ''}): {r['impl']}: "
            f"{r['why']}" for r in rows]
