"""What a compiled step costs per device: memory from ``memory_analysis()``, collectives from the HLO.

``collective_stats(hlo_text)`` counts all-reduce, all-gather, reduce-scatter,
collective-permute and all-to-all in ``compiled.as_text()``, with the bytes each
moves (its result size per device), multiplied by the trip count of any ``while``
loop around it (gradient accumulation, a ``scan``), so the figures are per step.
XLA:CPU has no pass that fuses an all-reduce followed by a slice into a
reduce-scatter (GPU and TPU do); such all-reduces are also counted under
``all-reduce+slice`` so a sharded-gradient reduction is recognisable on CPU.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import jax
import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8e4m3fn|f8e5m2)\[([\d,]*)\]")
_COMP_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([\w\-]+)\((.*)$")


def _shape_bytes(text: str) -> list[int]:
    return [_DTYPE_BYTES.get(dt, 4) * math.prod(int(d) for d in dims.split(",") if d)
            for dt, dims in _SHAPE.findall(text)]


def _parse(hlo: str):
    """``{computation: [(name, result_type, opcode, rest)]}`` and the entry computation's name."""
    comps: dict[str, list] = {}
    entry, current = None, None
    for line in hlo.splitlines():
        if (m := _COMP_HEADER.match(line)) and not line.startswith(" "):
            current = m.group(1)
            comps[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif current is not None and (m := _INSTR.match(line)):
            comps[current].append(m.groups())
    return comps, entry


def _multiplicity(comps, entry) -> dict[str, int]:
    """How many times each computation runs per call of the entry (while bodies times their trip count)."""
    mult: dict[str, int] = defaultdict(int)

    def visit(name, times, depth=0):
        if name not in comps or depth > 50:
            return
        mult[name] += times
        for _, _, op, rest in comps[name]:
            if op == "while":
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
                n = int(trip.group(1)) if trip else 1
                for key in ("body", "condition"):
                    if m := re.search(key + r"=%?([\w.\-]+)", rest):
                        visit(m.group(1), times * n, depth + 1)
            else:
                if op not in ("call", "conditional", "async-start"):
                    continue
                for m in re.finditer(r"(?:calls|to_apply|branch_computations|called_computations)=\{?%?([\w.\-]+)",
                                     rest):
                    visit(m.group(1), times, depth + 1)

    visit(entry, 1)
    return mult


def collective_stats(hlo: str) -> dict[str, dict[str, int]]:
    """``{kind: {"count", "bytes"}}`` per step for each collective kind (and ``all-reduce+slice``)."""
    comps, entry = _parse(hlo)
    mult = _multiplicity(comps, entry) if entry else defaultdict(lambda: 1)
    has_slice = {c: any(op == "dynamic-slice" for _, _, op, _ in instrs) for c, instrs in comps.items()}
    stats = {k: {"count": 0, "bytes": 0} for k in (*COLLECTIVES, "all-reduce+slice")}
    for comp, instrs in comps.items():
        times = mult.get(comp, 0) if entry else 1
        if not times:
            continue
        for name, rtype, op, _rest in instrs:
            kind = op[:-len("-start")] if op.endswith("-start") else op
            if kind not in COLLECTIVES:
                continue
            sizes = _shape_bytes(rtype)
            nbytes = max(sizes) if op.endswith("-start") else sum(sizes)
            stats[kind]["count"] += times
            stats[kind]["bytes"] += times * nbytes
            if kind == "all-reduce":
                sliced = _sliced_bytes(name, sizes, instrs, has_slice)
                if sliced:
                    stats["all-reduce+slice"]["count"] += times
                    stats["all-reduce+slice"]["bytes"] += times * sliced
    return stats


def _users(name, instrs):
    pat = re.compile(r"%" + re.escape(name) + r"(?![\w.\-])")
    return [(n, op, rest) for n, _, op, rest in instrs if pat.search(rest.split("metadata=")[0])]


def _feeds_slice(name, instrs, has_slice, depth=0) -> bool:
    """Whether ``name``'s value reaches a dynamic-slice (directly, through bitcasts/copies, or in a fusion)."""
    for user, op, rest in _users(name, instrs):
        if op == "dynamic-slice":
            return True
        if op == "fusion" and (m := re.search(r"calls=%?([\w.\-]+)", rest)) and has_slice.get(m.group(1)):
            return True
        if op in ("bitcast", "copy", "reshape", "get-tuple-element") and depth < 4 and \
                _feeds_slice(user, instrs, has_slice, depth + 1):
            return True
    return False


def _sliced_bytes(name, sizes, instrs, has_slice) -> int:
    """Bytes of the all-reduce ``name`` (per tuple element) whose result is only used sliced."""
    if len(sizes) == 1:
        return sizes[0] if _feeds_slice(name, instrs, has_slice) else 0
    total = 0
    for user, op, rest in _users(name, instrs):
        if op == "get-tuple-element" and (m := re.search(r"index=(\d+)", rest)):
            i = int(m.group(1))
            if i < len(sizes) and _feeds_slice(user, instrs, has_slice):
                total += sizes[i]
    return total


def memory_stats(compiled) -> dict[str, int]:
    """The per-device figures of ``compiled.memory_analysis()`` (bytes)."""
    ma = compiled.memory_analysis()
    if ma is None:
        return {}
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
            "generated_code_size_in_bytes")
    return {k.replace("_size_in_bytes", "_bytes"): int(getattr(ma, k, 0) or 0) for k in keys}


def per_device_bytes(tree) -> int:
    """Bytes of ``tree``'s arrays held by one device (the largest per device, for uneven layouts)."""
    total: dict[Any, int] = defaultdict(int)
    for x in jax.tree.leaves(tree):
        if not hasattr(x, "shape"):
            continue
        itemsize = np.dtype(x.dtype).itemsize
        sharding = getattr(x, "sharding", None)
        if sharding is None or not hasattr(sharding, "devices_indices_map"):
            total[None] += x.size * itemsize
            continue
        shard = sharding.shard_shape(x.shape)
        for d in sharding.device_set:
            total[d] += math.prod(shard) * itemsize
    return max(total.values()) if total else 0


def step_report(compiled, state=None) -> dict[str, Any]:
    """Per-device memory (state parts from the arrays' shardings, the rest from ``memory_analysis``) and
    collectives per step of a compiled train step."""
    mem = memory_stats(compiled)
    out: dict[str, Any] = {}
    if state is not None:
        out.update(param_bytes=per_device_bytes(state.params), optimizer_bytes=per_device_bytes(state.opt_state),
                   model_state_bytes=per_device_bytes(state.model_state))
    out.update(argument_bytes=mem.get("argument_bytes"), output_bytes=mem.get("output_bytes"),
               alias_bytes=mem.get("alias_bytes"),
               # Everything the step allocates besides its inputs/outputs: activations kept for the backward,
               # gradients, workspace.
               activation_bytes=mem.get("temp_bytes"))
    out["collectives"] = collective_stats(compiled.as_text())
    return out


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:10.3f} MiB"


def format_report(report: dict[str, Any], title: str = "per-device cost of one train step") -> str:
    """A plain-text table of ``step_report``'s figures."""
    rows = [title, "-" * len(title)]
    for key, label in (("param_bytes", "parameters"), ("optimizer_bytes", "optimizer state"),
                       ("model_state_bytes", "model state (BN stats)"), ("argument_bytes", "step arguments (all)"),
                       ("activation_bytes", "activations + temporaries"), ("output_bytes", "step outputs"),
                       ("alias_bytes", "outputs aliasing inputs")):
        if key in report:
            rows.append(f"  {label:<28}{_mib(report[key])}")
    rows.append(f"  {'collective':<20}{'count/step':>11}{'bytes/step':>16}")
    for kind, s in report["collectives"].items():
        if kind == "all-reduce+slice" and not s["count"]:
            continue
        label = kind if kind != "all-reduce+slice" else "  of which +slice"
        rows.append(f"  {label:<20}{s['count']:>11}{_mib(s['bytes']):>16}")
    return "\n".join(rows)
