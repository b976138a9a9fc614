"""Planning a pipeline: which units each stage runs, how many microbatches, and what the schedule costs.

Partitioning (``layout``): ``"2|3|3|2"`` gives the virtual stages 2, 3, 3 and 2 consecutive units
(``model.units()``); empty, the split balances the stages' estimated time. Each unit's time is
estimated from XLA's cost analysis of its forward and backward on one microbatch (lowered, not
compiled): ``flops / 1e12 + bytes accessed / 1e11`` seconds (a nominal 1 TFLOP/s and 100 GB/s,
so neither compute- nor memory-heavy units are ignored). The split minimises the largest stage
time (a linear partition, by dynamic programming). Without an input shape the units are balanced
by parameter count instead, and the plan says so.

Microbatches: explicit, or the divisor ``M`` of the batch (with ``batch / M`` divisible over
data x fsdp, and a multiple of S for the interleaved schedule) that minimises the estimated step
time ``(V*M + S - 1) * (OVERHEAD_EXAMPLES + batch / M)``: ticks of the schedule times the time of
one tick, modelled as a fixed per-action cost worth ``OVERHEAD_EXAMPLES`` examples plus one unit
per example of the microbatch. More microbatches shrink the bubble; smaller ones waste more of
each tick on the fixed cost.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax.parallel import pipeline_tables, schedules
from snnjax.parallel.pipeline import SCHEDULES, PipelineSpec
from snnjax.parallel.rules import both
from snnjax.parallel.variables import flat_vars, fresh, owner, value

OVERHEAD_EXAMPLES = 2.0  # the fixed cost of one pipeline action, in examples' worth of compute


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """What the user asks for (``parallel.pp.*``): 0 / "" mean automatic."""

    schedule: str = "1f1b"
    virtual_stages: int = 1
    microbatches: int = 0
    layout: str = ""


def option(name: str) -> str:
    """A pipeline option as both callers spell it: the config key, and ``PipelineOptions``'s field in Python."""
    return both(f"parallel.pp.{name}", f"PipelineOptions({name}=...)")


def parse_layout(text: str, num_units: int, num_stages: int, names: Sequence[str]) -> tuple[int, ...]:
    """``"2|3|3|2"`` -> ``(2, 3, 3, 2)``, checked against the model's units and the (virtual) stage count."""
    try:
        counts = tuple(int(p) for p in text.split("|"))
    except ValueError:
        raise ValueError(f"{option('layout')}={text!r} must be unit counts separated by '|', e.g. '2|3|3|2'") from None
    if len(counts) != num_stages or min(counts) < 1 or sum(counts) != num_units:
        raise ValueError(f"{option('layout')}={text!r} must give each of the {num_stages} (virtual) stages at least "
                         f"one unit and add up to the model's {num_units} units ({', '.join(names)})")
    return counts


def balance(costs: Sequence[float], num_stages: int) -> tuple[int, ...]:
    """Consecutive groups of ``costs`` (one per unit), ``num_stages`` of them, minimising the largest group sum."""
    n = len(costs)
    if num_stages > n:
        raise ValueError(f"{num_stages} (virtual) pipeline stages but the model has only {n} units; use fewer stages")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    best = np.full((num_stages + 1, n + 1), np.inf)
    cut = np.zeros((num_stages + 1, n + 1), int)
    best[0, 0] = 0.0
    for k in range(1, num_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1, i], prefix[j] - prefix[i])
                if v < best[k, j]:
                    best[k, j], cut[k, j] = v, i
    counts, j = [], n
    for k in range(num_stages, 0, -1):
        i = cut[k, j]
        counts.append(int(j - i))
        j = int(i)
    return tuple(reversed(counts))


def unit_costs(model: nnx.Module, input_shape: Sequence[int], dtype) -> list[float]:
    """Estimated seconds of each unit's forward + backward on inputs ``[T, mb, ...]`` (see the module docstring)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    costs = []
    x = jax.ShapeDtypeStruct(tuple(input_shape), dtype)
    for i in range(len(model.units())):
        def run(p, r, x, i=i):
            return nnx.merge(graphdef, p, fresh(r)).units()[i](x)

        def fwd_bwd(p, r, x, run=run):
            y, vjp = jax.vjp(lambda p, x: run(p, r, x), p, x)
            return vjp(jnp.ones_like(y))

        cost = jax.jit(fwd_bwd).lower(params, rest, x).cost_analysis() or {}
        costs.append(float(cost.get("flops", 0.0)) / 1e12 + float(cost.get("bytes accessed", 0.0)) / 1e11)
        x = jax.eval_shape(run, params, rest, x)
    return costs


def param_counts(model: nnx.Module) -> list[float]:
    """Parameters per unit (the fallback balance without an input shape)."""
    units = model.units()
    counts = [0.0] * len(units)
    for path, var in flat_vars(nnx.state(model, nnx.Param)):
        counts[owner([u.owns for u in units], path)] += float(np.size(value(var)))
    return counts


def microbatch_options(batch: int, shards: int, stages: int, virtual: int, schedule: str) -> list[tuple[int, float]]:
    """Every valid microbatch count ``M`` with its estimated step time (the module docstring's rule, in units of
    one example's stage action), fastest first."""
    out = []
    for m in range(1, batch + 1):
        if batch % m or (batch // m) % shards or (schedule == "interleaved" and m % stages):
            continue
        out.append((m, (virtual * m + stages - 1) * (OVERHEAD_EXAMPLES + batch / m)))
    return sorted(out, key=lambda mt: (mt[1], mt[0]))


def choose_microbatches(batch: int, shards: int, stages: int, virtual: int, schedule: str) -> int:
    """The microbatch count of the module docstring's rule (ValueError if no divisor of ``batch`` works)."""
    options = microbatch_options(batch, shards, stages, virtual, schedule)
    if not options:
        need = "a multiple of the stage count, " if schedule == "interleaved" else ""
        raise ValueError(f"no microbatch count M divides the batch of {batch} into {need}microbatches divisible over "
                         f"data x fsdp = {shards}; change global_batch_size or set {option('microbatches')}")
    return options[0][0]


def make_spec(model: nnx.Module, stages: int, options: PipelineOptions, *, global_batch_size: int | None,
              batch_shards: int, input_shape: Sequence[int] | None = None,
              dtype=jnp.float32) -> tuple[PipelineSpec, list[str]]:
    """The ``PipelineSpec`` for ``options`` on ``stages`` devices, and the reasons for what was chosen.

    ``input_shape``: the model's batch input ``[T, N, ...]`` (for the cost-balanced split).
    """
    if options.schedule not in SCHEDULES:
        raise ValueError(f"{option('schedule')}={options.schedule!r} is not one of {list(SCHEDULES)}")
    virtual = options.virtual_stages
    if virtual < 1 or (virtual > 1 and options.schedule != "interleaved"):
        raise ValueError(f"{option('virtual_stages')}={virtual}: must be >= 1, and > 1 only with the 'interleaved' "
                         "schedule")
    reasons = []
    m = options.microbatches
    if m < 0:
        raise ValueError(f"{option('microbatches')} must be >= 0 (0: automatic), got {m}")
    if m == 0:
        if global_batch_size is None:
            raise ValueError("an automatic microbatch count needs the global batch size; pass global_batch_size or "
                             f"set {option('microbatches')}")
        m = choose_microbatches(global_batch_size, batch_shards, stages, virtual, options.schedule)
        reasons.append(f"{m} microbatches of {global_batch_size // m}: the lowest estimated step time "
                       f"(ticks x (fixed cost of {OVERHEAD_EXAMPLES:g} examples + microbatch size))")
    elif global_batch_size is not None and (global_batch_size % m or (global_batch_size // m) % batch_shards):
        raise ValueError(f"the batch of {global_batch_size} does not split into {m} microbatches divisible over "
                         f"data x fsdp = {batch_shards}; change {option('microbatches')} or global_batch_size")
    if options.schedule == "interleaved" and m % stages:
        raise ValueError(f"the interleaved schedule runs microbatches in rounds of one per stage: "
                         f"{option('microbatches')}={m} must be a multiple of stage={stages}")
    units = model.units()
    num_g = stages * virtual
    if options.layout:
        layout = parse_layout(options.layout, len(units), num_g, [u.name for u in units])
    elif input_shape is not None:
        shape = (input_shape[0], input_shape[1] // m, *input_shape[2:])
        layout = balance(unit_costs(model, shape, dtype), num_g)
        reasons.append(f"layout {'|'.join(map(str, layout))}: stages balanced by XLA's cost analysis of each unit's "
                       "forward and backward")
    else:
        layout = balance(param_counts(model), num_g)
        reasons.append(f"layout {'|'.join(map(str, layout))}: stages balanced by parameter count (no input shape "
                       "to estimate compute from)")
    return PipelineSpec(options.schedule, stages, m, layout, virtual), reasons


def summary(spec: PipelineSpec, unit_names: Sequence[str] | None = None) -> dict[str, Any]:
    """The schedule's name, ticks, bubble fraction and stage inputs held per device, and each stage's units."""
    sched = spec.make_schedule()
    tables = pipeline_tables.build(sched)
    out = {"schedule": spec.schedule, "stages": spec.stages, "virtual_stages": spec.virtual,
           "microbatches": spec.microbatches, "layout": list(spec.layout), "ticks": schedules.makespan(sched),
           "bubble_fraction": schedules.bubble_fraction(sched), "peak_in_flight": list(schedules.peak_in_flight(sched)),
           "stage_inputs_held": tables.act_slots, "text": schedules.render_text(sched)}
    if unit_names is not None:
        out["units"] = [list(unit_names[lo:hi]) for lo, hi in spec.unit_ranges()]
    return out
