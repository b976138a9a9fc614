"""Temporal parallelism as a plan sees it: T over the mesh axis ``time``, its checks, summary and step layout.

With ``time = P > 1`` in the mesh, every strategy's rules put the logical ``time`` axis of the
activations on it (``rules.TIME_RULES``): per-time-step layers partition like data parallelism
(weight gradients and BatchNorm statistics all-reduced over ``time``, as over ``data``), and the
neurons run as a pipeline over blocks of neurons (``snnjax.neurons.kernels.temporal``). ``summary`` states
the schedule; ``neuron_schedules`` lists each neuron layer's blocks, bubble and bytes for an input
shape; ``StepLayout`` carries the requested block count into the traced step.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.neurons.kernels import temporal as neuron_temporal
from snnjax.parallel import layout, neuron_paths


def check(time_shards: int, time_steps: int | None, time_blocks: int) -> None:
    """Raise ValueError saying what to change when T cannot split over ``time_shards`` devices."""
    if time_blocks < 0:
        raise ValueError(f"time_blocks must be >= 0 (0: automatic), got {time_blocks}")
    if time_steps is not None and time_steps % time_shards:
        raise ValueError(f"T={time_steps} time steps do not divide over the mesh axis time={time_shards}; use a "
                         f"T that is a multiple of {time_shards} (data.time_steps) or a time axis that divides "
                         f"{time_steps}")


def summary(time_shards: int, time_steps: int | None, time_blocks: int,
            in_pipeline: bool = False) -> dict[str, Any] | None:
    """What the plan says about the time split (None when ``time`` is 1); ``in_pipeline``: inside the stages of a
    pipeline over ``stage`` (where XLA:CPU needs the potentials exchanged by all-gather)."""
    if time_shards < 2:
        return None
    want = neuron_temporal.min_blocks(time_shards)
    blocks = time_blocks or want
    return {"time_shards": time_shards, "steps_per_shard": None if time_steps is None else time_steps // time_shards,
            "blocks": time_blocks or "auto", "auto_min_blocks": want,
            "bubble": round(neuron_temporal.bubble(time_shards, blocks), 4),
            "bytes_per_step": "2 x (neurons / B) x state bytes x (B + P - 1) per neuron layer and device",
            "exchange": ("all-gather" if in_pipeline and jax.default_backend() == "cpu" else "collective-permute")}


def describe(info: dict[str, Any]) -> str:
    """One line for ``print(plan)``."""
    per = "" if info["steps_per_shard"] is None else f" ({info['steps_per_shard']} steps per device)"
    if info["blocks"] == "auto":
        blocks = (f"auto blocks (>= {info['auto_min_blocks']} where a layer's shape allows, each of >= "
                  f"{neuron_temporal.MIN_BLOCK_NEURONS} neurons): bubble <= {info['bubble']:.1%}")
    else:
        blocks = f"{info['blocks']} blocks: bubble {info['bubble']:.1%}"
    return (f"  temporal: T over time={info['time_shards']}{per}; neurons pipelined over {blocks}; each neuron "
            f"layer sends per device and step {info['bytes_per_step'].split(' per ')[0]}"
            + ("" if info["exchange"] == "collective-permute" else
               " (inside the pipeline's stages on the CPU: each block's potentials all-gathered over time, as "
               "XLA:CPU cannot run a collective-permute in one stage's branch; P times the bytes)"))


def neuron_schedules(model: nnx.Module, input_shape: tuple[int, ...], time_shards: int, dtype=jnp.float32,
                     time_blocks: int = 0) -> list[tuple[tuple[int, ...], neuron_temporal.Schedule]]:
    """``(input shape, Schedule)`` of each multi-step neuron call of ``model`` on ``[T, N, ...]``, in call order.

    Traced for shapes only (``neuron_paths.trace``) on an abstract mesh ``time=time_shards``: no devices needed.
    """
    return neuron_paths.trace(model, input_shape, {neuron_temporal.TIME_AXIS: time_shards}, dtype, time_blocks)[1]


def format_schedules(schedules) -> str:
    """A table of ``neuron_schedules``: shape, blocks, bubble and bytes sent per device and step."""
    rows = [f"  {'neuron input':<28}{'blocks':>7}{'bubble':>8}{'bytes sent/step':>17}"]
    for shape, s in schedules:
        rows.append(f"  {str(shape):<28}{s.blocks:>7}{s.bubble:>8.1%}{s.bytes_sent:>17,}")
    return "\n".join(rows)


@dataclasses.dataclass(frozen=True, eq=False)
class StepLayout(layout.StepLayout):
    """``layout.StepLayout`` that also sets the neurons' block count (``time_blocks``, 0: automatic)."""

    time_blocks: int = 0

    @contextlib.contextmanager
    def context(self):
        with super().context(), neuron_temporal.block_count(self.time_blocks), neuron_temporal.devices(self.mesh):
            yield
