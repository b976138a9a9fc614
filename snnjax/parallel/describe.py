"""Plans and shardings as text: what ``print(plan)`` and ``describe_shardings`` show."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from snnjax.parallel.conv_paths import describe as describe_convolutions
from snnjax.parallel.neuron_paths import describe as describe_neurons
from snnjax.parallel.temporal import describe as describe_temporal
from snnjax.parallel.variables import path_str


def spec_str(spec: PartitionSpec) -> str:
    """``PartitionSpec(('data', 'fsdp'), None)`` -> ``(data+fsdp, -)``."""
    return "(" + ", ".join("-" if e is None else (e if isinstance(e, str) else "+".join(e)) for e in spec) + ")"


def format_plan(plan: Any) -> str:
    """The table ``print(plan)`` shows: mode, reasons, each parameter's layout and bytes, totals, the time split,
    which path runs each neuron type and the convolutions, collectives."""
    t = plan.totals()
    mesh = " x ".join(f"{k}={v}" for k, v in plan.axis_sizes.items() if v > 1) or "1 device"
    sp = ", sequence parallel" if plan.strategy.sequence_parallel else ""
    what = plan.strategy.description
    if getattr(plan, "pipeline", None) is not None:
        what = f"a pipeline over stage; within each stage {what}"
    lines = [f"plan: mode={plan.mode} (zero_stage={plan.zero_stage}{sp}) on {mesh}: {what}"]
    lines += [f"  why: {r}" for r in plan.reasons]
    w = max([len(p.path) for p in plan.params] + [9])
    lines.append(f"  {'parameter':<{w}}  {'shape':<18} {'logical axes':<34} {'stored':<22} {'optimizer':<22} "
                 f"{'bytes/device':>12}")
    for p in plan.params:
        names = "(" + ", ".join(n or "-" for n in p.logical_axes) + ")" if p.logical_axes else "(unnamed)"
        lines.append(f"  {p.path:<{w}}  {str(p.shape):<18} {names:<34} {spec_str(p.layout.param):<22} "
                     f"{spec_str(p.layout.opt):<22} {p.param_bytes:>12,}")
        for note in p.layout.notes:
            lines.append(f"  {'':<{w}}    note: {note}")
    lines.append(f"  per device: parameters {t['param_bytes_per_device']:,} B (of {t['param_bytes']:,}), "
                 f"gradients {t['grad_bytes_per_device']:,} B, optimizer ({plan.opt_slots} slots) "
                 f"{t['optimizer_bytes_per_device']:,} B (replicated: {t['optimizer_bytes_replicated']:,})")
    if getattr(plan, "offload", "none") != "none":
        lines.append(_offload_line(plan.offload, t))
    if getattr(plan, "temporal", None):
        lines.append(describe_temporal(plan.temporal))
    if getattr(plan, "neurons", None):
        lines += describe_neurons(plan.neurons)
    if getattr(plan, "convolutions", None):
        lines += describe_convolutions(plan.convolutions)
    if getattr(plan, "pipeline_summary", None):
        lines += _pipeline_lines(plan.pipeline_summary)
    for c in plan.expected_collectives:
        size = f"{c['bytes']:,} B" if c.get("bytes") is not None else "activation-sized"
        lines.append(f"  expect {c['kind']} over {'x'.join(c['over'])}: {c['what']} ({size})")
    return "\n".join(lines)


def _offload_line(offload: str, totals: dict[str, int]) -> str:
    """What a plan keeps in host memory between steps (``Plan.with_offload``) and how the step reads it."""
    parts = []
    if offload in ("params", "all"):
        parts.append(f"parameters ({totals['param_bytes_per_device']:,} B per device) in host memory (pinned_host); "
                     "each unit's are fetched to the device when the unit runs, in the forward and again in its "
                     "backward, and their gradients written back to host memory")
    if offload in ("opt_state", "all"):
        parts.append(f"optimizer state ({totals['optimizer_bytes_per_device']:,} B per device) in host memory "
                     "(pinned_host), moved to the device for the update")
    return f"  offload={offload}: " + "; ".join(parts)


def describe_shardings(tree, *, title: str | None = None) -> str:
    """A table of every array in ``tree``: path, shape, dtype and its sharding's PartitionSpec."""
    rows = [title] if title else []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(x, "shape"):
            continue
        spec = getattr(getattr(x, "sharding", None), "spec", None)
        rows.append(f"  {path_str(path):<40} {str(tuple(x.shape)):<18} {str(x.dtype):<8} "
                    f"{spec_str(spec) if spec is not None else type(getattr(x, 'sharding', None)).__name__}")
    return "\n".join(rows)


def _pipeline_lines(p: dict[str, Any]) -> list[str]:
    """The pipeline part of a plan: schedule, bubble, stage inputs held, each stage's units and the tick table."""
    lines = [f"  pipeline: {p['schedule']} over stage={p['stages']}"
             + (f" x {p['virtual_stages']} virtual" if p["virtual_stages"] > 1 else "")
             + f", {p['microbatches']} microbatches, {p['ticks']} ticks, bubble {p['bubble_fraction']:.1%}, "
             f"at most {p['stage_inputs_held']} stage inputs held per device (peak in flight per device: "
             f"{p['peak_in_flight']})"]
    for g, units in enumerate(p.get("units", [])):
        lines.append(f"    stage {g} (device {g % p['stages']}): {', '.join(units)}")
    lines += ["    " + row for row in p["text"].splitlines()]
    return lines


def shard_blocks(array: jax.Array, dims: tuple[int, int] | None = None) -> tuple[tuple[int, int], list[dict]]:
    """Where each device's block of ``array`` lies, projected onto two of its dims (any rank: a 4-D conv
    kernel ``[kh, kw, I, O]`` shows its ``I x O`` plane by default).

    ``dims``: the (row, column) dims; default the sharded dims, filled up with the trailing others (a 1-D
    array is one row). Returns ``(dims, blocks)``, each block ``{"rows": (lo, hi), "cols": (lo, hi),
    "devices": [ids]}`` (replicated blocks list every device holding them).
    """
    shape = tuple(array.shape)
    index = array.sharding.devices_indices_map(shape)

    def bounds(sl: slice, n: int) -> tuple[int, int]:
        lo, hi, _ = sl.indices(n)
        return lo, hi

    if dims is None:
        split = [d for d in range(len(shape)) if len({bounds(ix[d], shape[d]) for ix in index.values()}) > 1]
        rest = sorted((d for d in range(len(shape)) if d not in split), reverse=True)  # trailing: channels
        dims = tuple(sorted((split + rest)[:2])) if len(shape) >= 2 else (None, 0) if shape else (None, None)
    blocks: dict[tuple, list[int]] = {}
    for device, ix in index.items():
        rows = bounds(ix[dims[0]], shape[dims[0]]) if dims[0] is not None else (0, 1)
        cols = bounds(ix[dims[1]], shape[dims[1]]) if dims[1] is not None else (0, 1)
        blocks.setdefault((rows, cols), []).append(device.id)
    return dims, [{"rows": r, "cols": c, "devices": sorted(d)} for (r, c), d in sorted(blocks.items())]


def stage_rows(packing) -> list[dict[str, Any]]:
    """A pipeline's packed ``[S, width]`` parameter rows by parameter name (``snnjax.parallel.stage_params``):
    ``{"device", "path", "offset", "size", "shape"}`` per parameter, in row order."""
    paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(packing.abstract_tree())[0]]
    rows = [{"device": d, "path": p, "offset": o, "size": int(np.prod(s)), "shape": tuple(s)}
            for d, p, o, s in zip(packing.device, paths, packing.offset, packing.shapes, strict=True)]
    return sorted(rows, key=lambda r: (r["device"], r["offset"]))


def describe_stage_rows(packing) -> str:
    """``stage_rows`` as text: each device's row, the parameters in it and the padding."""
    lines = [f"pipeline parameter rows [{packing.stages}, {packing.width}] ({np.dtype(packing.dtype).name}), "
             "one per stage device:"]
    for d in range(packing.stages):
        rows = [r for r in stage_rows(packing) if r["device"] == d]
        used = sum(r["size"] for r in rows)
        lines.append(f"  device {d}: {used:,} of {packing.width:,} used")
        lines += [f"    [{r['offset']:>9,} : {r['offset'] + r['size']:>9,}]  {r['path']:<36} {r['shape']}"
                  for r in rows]
    return "\n".join(lines)
