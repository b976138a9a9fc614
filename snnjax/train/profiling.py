"""Profiler traces of chosen training steps, and where a step's time goes, read from a trace.

``StepProfiler`` wraps steps ``first..last`` (1-based, the step numbers ``metrics.jsonl`` logs) in a
``jax.profiler`` trace: the folder it writes (``plugins/profile/<run>/``) opens in TensorBoard's profile plugin
(``tensorboard --logdir DIR``) and its ``perfetto_trace.json.gz`` in https://ui.perfetto.dev.

``time_split(trace, hlo_text)`` sums the trace's op events by what each op of the compiled step does, read off
its HLO (``compiled.as_text()``): ``neuron`` (ops the neurons' ``jax.named_scope`` marks, the native / Pallas
kernel calls), ``convolution``, ``matmul``, ``collectives`` (all-reduce, all-gather, reduce-scatter,
all-to-all, collective-permute: pipeline transfers included), ``copies`` (transposes, copies, pads and
slices that only move data between layouts), ``other`` (the rest: elementwise fusions, reductions,
the optimizer), and ``outside ops``: the traced steps' wall time not covered by an op (dispatch, host work,
and idle devices, which in a pipeline are its bubbles).
"""
from __future__ import annotations

import gzip
import json
import pathlib
import re
from collections.abc import Sequence

import jax

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast")
LAYOUT_OPS = {"copy", "transpose", "bitcast", "reshape", "broadcast", "pad", "slice", "dynamic-slice",
              "dynamic-update-slice", "concatenate", "parameter", "constant", "tuple", "get-tuple-element"}
NEURON_SCOPE = re.compile(r"(^|/)(transpose\(|jvp\()*neuron_")  # the scope snnjax.neurons opens: neuron_<KIND>
CATEGORIES = ("neuron", "convolution", "matmul", "collectives", "copies", "other", "outside ops")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([\w\-]+)\((.*)$")


def parse_steps(value, *, name: str = "profile_steps") -> tuple[int, int] | None:
    """``(first, last)`` from ``value``: None / ``()`` (no trace), a step ``a``, ``(a,)``, ``(a, b)`` or ``"a,b"``."""
    if value in (None, (), [], ""):
        return None
    if isinstance(value, str):
        value = tuple(int(v) for v in value.split(",") if v.strip())
    steps = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(steps) <= 2 or not all(isinstance(s, int) and s >= 1 for s in steps) or steps[0] > steps[-1]:
        raise ValueError(f"{name}={value!r}: give the first and last step to trace, 1-based (e.g. (3, 4), or 3 "
                         f"for one step)")
    return steps[0], steps[-1]


class StepProfiler:
    """Traces steps ``steps[0]..steps[1]`` (1-based) into ``directory``; nothing when ``steps`` is None."""

    def __init__(self, steps: tuple[int, int] | None, directory: str | pathlib.Path):
        self.steps, self.directory = steps, pathlib.Path(directory)
        self.trace: pathlib.Path | None = None  # the perfetto trace, once written
        self._active = False

    def before(self, step: int) -> None:
        """Call before running step ``step`` (1-based)."""
        if self.steps is not None and step == self.steps[0]:
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)
            self._active = True

    def after(self, step: int, outputs) -> pathlib.Path | None:
        """Call after step ``step`` with its outputs; at the last traced step waits for them, ends the trace and
        returns its perfetto file."""
        if not self._active or step != self.steps[1]:
            return None
        jax.block_until_ready(outputs)
        self.close()
        return self.trace

    def close(self) -> None:
        """End a trace still running (a run that stopped inside the traced steps)."""
        if self._active:
            jax.profiler.stop_trace()
            self._active = False
            found = sorted(self.directory.glob("plugins/profile/*/perfetto_trace.json.gz"))
            self.trace = found[-1] if found else None


def op_categories(hlo_text: str) -> dict[str, str]:
    """``{instruction name: category}`` for every instruction of a compiled module's HLO text; a fusion takes
    the category of what it calls (its own metadata decides ``neuron``)."""
    calls, own, scoped = {}, {}, {}
    computation: list[str] = []
    members: dict[str, list[str]] = {}
    for line in hlo_text.splitlines():
        if line.rstrip().endswith("{") and "=" not in line.split("{")[0]:
            name = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            computation = members.setdefault(name.lstrip("%"), [])
            continue
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        inst, opcode, rest = m.groups()
        computation.append(inst)
        op_name = re.search(r'op_name="([^"]*)"', rest)
        target = re.search(r'custom_call_target="([^"]*)"', rest)
        scoped[inst] = bool(op_name and NEURON_SCOPE.search(op_name.group(1))) or bool(
            target and re.search(r"neuron|snn", target.group(1), re.IGNORECASE))
        own[inst] = opcode
        called = re.search(r"calls=%?([\w.\-]+)", rest)
        if called:
            calls[inst] = called.group(1)

    def opcodes(inst: str, seen: frozenset = frozenset()) -> set[str]:
        if inst in calls and calls[inst] not in seen:
            return set().union(*(opcodes(i, seen | {calls[inst]}) for i in members.get(calls[inst], [])))
        return {own[inst]}

    out = {}
    for inst in own:
        ops = opcodes(inst)
        if any(op.startswith(c) for op in ops for c in COLLECTIVES):
            out[inst] = "collectives"
        elif scoped[inst]:
            out[inst] = "neuron"
        elif "convolution" in ops:
            out[inst] = "convolution"
        elif "dot" in ops:
            out[inst] = "matmul"
        elif ops <= LAYOUT_OPS:
            out[inst] = "copies"
        else:
            out[inst] = "other"
    return out


def time_split(trace: str | pathlib.Path, hlo_text: str | Sequence[str]) -> dict[str, float]:
    """Milliseconds per category (``CATEGORIES``) of the op events in a perfetto ``trace`` of compiled steps
    whose HLO is ``hlo_text`` (several programs: a sequence of texts), plus ``traced`` (the wall time from the
    first op to the last). Ops on several threads or devices overlap, so the categories can add up to more than
    ``traced``; ``outside ops`` is ``traced`` minus the union of op intervals."""
    texts = [hlo_text] if isinstance(hlo_text, str) else list(hlo_text)
    categories: dict[str, str] = {}
    for text in texts:
        categories.update(op_categories(text))
    with gzip.open(trace, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    split = dict.fromkeys(CATEGORIES, 0.0)
    intervals = []
    for e in events:
        if e.get("ph") != "X":
            continue
        name = (e.get("args") or {}).get("hlo_op") or e.get("name", "")
        category = categories.get(name)
        if category is None:
            continue
        split[category] += e.get("dur", 0.0) / 1e3
        intervals.append((e["ts"], e["ts"] + e.get("dur", 0.0)))
    if not intervals:
        raise ValueError(f"{trace}: no op of the given program is in this trace (was it traced while the program "
                         f"ran, and is the HLO the compiled one?)")
    intervals.sort()
    covered, end = 0.0, intervals[0][0]
    for a, b in intervals:
        covered += max(0.0, b - max(a, end))
        end = max(end, b)
    split["traced"] = (end - intervals[0][0]) / 1e3
    split["outside ops"] = split["traced"] - covered / 1e3
    return split


def format_split(split: dict[str, float]) -> str:
    """One line: each category's milliseconds and share of the traced time."""
    total = split["traced"] or 1.0
    parts = [f"{k} {split[k]:.1f} ms ({100 * split[k] / total:.0f}%)" for k in CATEGORIES if split[k] > 0]
    return f"traced {split['traced']:.1f} ms: " + ", ".join(parts)
