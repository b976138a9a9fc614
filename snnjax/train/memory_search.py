"""The memory search: the fastest checkpointing / spike-storage / offload plan whose compiled peak fits a budget.

1. Each model unit's forward + backward is traced under each policy (``memory_estimate.profile_units``,
   no compilation): the bytes it keeps for the backward, its peak while its backward runs, its forward
   flops.
2. Candidates, presumed fastest first: no checkpointing with float spikes, then with bit-packed spikes,
   then the units switched to ``units`` (recompute the unit from its input) one by one, in the order of
   the bytes each saves per recomputed flop (the best trade first); then, when offloading is searched
   (``parallel.offload="auto"`` on a backend whose host memory is not its device memory), the same plans
   with the optimizer state in host memory: offloading moves the whole optimizer state over the host link
   twice per step, which is presumed slower than any recomputation.
3. The first candidate whose estimated peak (times a calibration, 1 at first) fits is compiled and XLA's
   ``memory_analysis`` of that program gives its true peak (arguments + outputs not aliasing them +
   temporaries). If it fits, it is chosen; if not, the calibration becomes measured / estimated and the
   next candidate that fits is compiled. ``step_compiler`` compiles with XLA's backend (LLVM)
   optimisation off: the HLO passes and the buffer assignment, hence the memory analysis, are the same
   (checked in the tests), and compiling takes about 25% less.

    result = search_model(model, step_config, optimizer, batch_spec, budget_bytes=1300 * 2**20)
    print(result.summary())

``search(plans, compile_for, budget)`` is the loop on its own: ``compile_for(candidate)`` returns the
compiled step for a ``Candidate`` (``step_compiler`` builds one for a model and a batch shape);
``optimize_ms`` is the search's time, ``compile_ms`` the part spent compiling.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from snnjax.layers.conv_cpu import compiler_options
from snnjax.models import remat
from snnjax.train import memory_estimate as me
from snnjax.train import offload as offload_lib
from snnjax.train.step import TrainState, split_model, train_step


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One plan: the model's memory settings and what is offloaded to host memory."""

    settings: remat.MemorySettings = remat.NONE
    offload: str = "none"

    def describe(self) -> str:
        return self.settings.describe() + (f", offload={self.offload}" if self.offload != "none" else "")


@dataclasses.dataclass(frozen=True)
class Measured:
    """A compiled candidate: peak bytes per device, flops and bytes accessed per step, compile seconds."""

    candidate: Candidate
    peak_bytes: int
    temp_bytes: int
    flops: float
    bytes_accessed: float
    compile_s: float
    estimate_bytes: int | None = None


def peak_bytes(compiled) -> tuple[int, int]:
    """``(peak, temporaries)`` bytes per device of a compiled step from ``memory_analysis()``: arguments,
    plus outputs that do not alias (donated) arguments, plus temporaries."""
    ma = compiled.memory_analysis()
    arg, out = int(ma.argument_size_in_bytes), int(ma.output_size_in_bytes)
    alias, temp = int(ma.alias_size_in_bytes), int(ma.temp_size_in_bytes)
    return arg + out - alias + temp, temp


def cost(compiled) -> tuple[float, float]:
    """``(flops, bytes accessed)`` per step from the compiled ``cost_analysis()`` (0 where not reported)."""
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    ca = ca or {}
    return float(ca.get("flops", 0.0)), float(ca.get("bytes accessed", 0.0))


def measure(compile_for: Callable[[Candidate], Any], candidate: Candidate,
            estimate_bytes: int | None = None) -> Measured:
    """Compile ``candidate`` and read its memory and cost analyses."""
    t0 = time.perf_counter()
    compiled = compile_for(candidate)
    seconds = time.perf_counter() - t0
    peak, temp = peak_bytes(compiled)
    flops, accessed = cost(compiled)
    return Measured(candidate, peak, temp, flops, accessed, seconds, estimate_bytes)


@dataclasses.dataclass(frozen=True)
class Planned:
    """A candidate with its estimated peak bytes and the forward flops its checkpointing recomputes."""

    candidate: Candidate
    estimate_bytes: int
    recompute_flops: float


def candidates(units: Sequence[dict[str, me.UnitMemory]], float_units: Sequence[dict[str, me.UnitMemory]],
               base_bytes: int, offloads: Sequence[str] = ("none",), offloaded_bytes: int = 0) -> list[Planned]:
    """The candidates in the order the search tries them (see the module docstring), with their estimates.

    ``units``: ``memory_estimate.profile_units`` with bit-packed spikes; ``float_units``: the same with float
    spikes (only ``none`` is used); ``base_bytes``: what lives through the whole step; ``offloads``: the
    ``snnjax.train.offload`` settings to try, in order, each with every checkpointing plan; ``offloaded_bytes``:
    the device bytes that offloading the optimizer state frees."""
    names = [u["none"].name for u in units]
    none = ["none"] * len(units)
    plans = [Planned(Candidate(remat.NONE), me.estimate(float_units, none, base_bytes), 0.0),
             Planned(Candidate(remat.settings("none", "bits")), me.estimate(units, none, base_bytes), 0.0)]
    saved = {i: u["none"].kept - u["units"].kept for i, u in enumerate(units)}
    order = sorted((i for i in saved if saved[i] > 0),
                   key=lambda i: -saved[i] / max(units[i]["none"].flops, 1.0))
    policies, flops = list(none), 0.0
    for i in order:
        policies[i] = "units"
        flops += units[i]["none"].flops
        per_unit = {n: p for n, p in zip(names, policies, strict=True) if p != "none"}
        plans.append(Planned(Candidate(remat.settings(per_unit, "bits")), me.estimate(units, policies, base_bytes),
                             flops))
    return [Planned(Candidate(p.candidate.settings, offload),
                    p.estimate_bytes - (offloaded_bytes if offload != "none" else 0), p.recompute_flops)
            for offload in offloads for p in plans]


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """The chosen candidate (None: none fits), every compiled candidate, the budget, the search time and the
    part of it spent compiling, and the calibration (compiled / estimated peak) it ended with."""

    chosen: Measured | None
    tried: tuple[Measured, ...]
    budget_bytes: int
    optimize_ms: float
    compile_ms: float
    calibration: float
    num_candidates: int

    def summary(self) -> str:
        mib = lambda b: f"{b / 2**20:,.1f} MiB"  # noqa: E731
        lines = [f"memory search: budget {mib(self.budget_bytes)}, {self.num_candidates} candidates, "
                 f"{len(self.tried)} compiled, {self.optimize_ms / 1e3:.2f} s ({self.compile_ms / 1e3:.2f} s "
                 "compiling)"]
        for m in self.tried:
            mark = "*" if m is self.chosen else " "
            estimate = f"estimated {mib(m.estimate_bytes)}, " if m.estimate_bytes is not None else ""
            lines.append(f"  {mark} {m.candidate.describe()}: {estimate}compiled peak {mib(m.peak_bytes)}, "
                         f"{m.flops / 1e9:,.1f} GFLOP, {'fits' if m.peak_bytes <= self.budget_bytes else 'over'}")
        lines.append("  chosen: " + (self.chosen.candidate.describe() if self.chosen else
                                     "nothing fits: the smallest compiled peak is shown above"))
        return "\n".join(lines)


def search(plans: Sequence[Planned], compile_for: Callable[[Candidate], Any], budget_bytes: int, *,
           started: float | None = None) -> SearchResult:
    """The first of ``plans`` (fastest first) whose compiled peak is at most ``budget_bytes``.

    Only candidates whose calibrated estimate fits are compiled (the last one is compiled when none seems
    to fit); after each compiled miss the calibration becomes the largest compiled / estimated ratio seen.
    ``started``: ``time.perf_counter()`` when the search began (the profiling before ``plans`` was built
    counts towards ``optimize_ms``)."""
    t0 = time.perf_counter() if started is None else started
    tried: list[Measured] = []
    chosen, calibration, i, compile_s = None, 1.0, 0, 0.0
    while i < len(plans):
        fits = [j for j in range(i, len(plans)) if plans[j].estimate_bytes * calibration <= budget_bytes]
        j = fits[0] if fits else len(plans) - 1
        m = measure(compile_for, plans[j].candidate, plans[j].estimate_bytes)
        compile_s += m.compile_s
        tried.append(m)
        if m.peak_bytes <= budget_bytes:
            chosen = m
            break
        calibration = max(calibration, m.peak_bytes / max(plans[j].estimate_bytes, 1))
        i = j + 1
    return SearchResult(chosen, tuple(tried), int(budget_bytes), (time.perf_counter() - t0) * 1e3, compile_s * 1e3,
                        calibration, len(plans))


def search_model(model, cfg, tx, batch: dict[str, Any], budget_bytes: int, *, inputs=None,
                 offloads: Sequence[str] = ("none",)) -> SearchResult:
    """Profile ``model``'s units and ``search`` its candidates (timed as one) for train steps with ``cfg`` and
    optimizer ``tx`` on ``batch`` (``jax.ShapeDtypeStruct``s; ``inputs``: what the model sees, ``[T, N, ...]``,
    where the step encodes ``batch["inputs"]`` first), with each of ``offloads`` in turn. ``model`` may be
    abstract; it ends configured as the last compiled candidate."""
    t0 = time.perf_counter()
    inputs = batch["inputs"] if inputs is None else inputs
    units = me.profile_units(model, inputs, "bits")
    float_units = me.profile_units(model, inputs, "float", policies=("none",))
    state = abstract_state(model, tx)
    freed = me.state_bytes(state.opt_state) if offload_lib.saves_device_memory() else 0
    plans = candidates(units, float_units, me.step_base_bytes(state, batch), offloads, freed)
    return search(plans, step_compiler(model, cfg, tx, batch), budget_bytes, started=t0)


def abstract_state(model, tx) -> TrainState:
    """``model``'s ``TrainState`` (optimizer ``tx``) as ``jax.ShapeDtypeStruct``s."""
    _, params, rngs, rest = split_model(model)
    state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                       opt_state=jax.eval_shape(tx.init, params))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


ANALYSIS_OPTIONS = {"xla_backend_optimization_level": 0}  # what the memory and cost analyses read is unchanged


def step_compiler(model, cfg, tx, batch: dict[str, Any], *, analysis_only: bool = True) -> Callable[[Candidate], Any]:
    """``compile_for(candidate)``: ``model``'s train step (``snnjax.train.step.train_step`` with ``cfg`` and
    optimizer ``tx``) configured as the candidate says, compiled for ``batch`` (arrays or
    ``jax.ShapeDtypeStruct``). ``model`` may be abstract (``nnx.eval_shape``); it is configured in place.
    ``analysis_only``: compile for the analyses (``ANALYSIS_OPTIONS``), not to run fast.
    """
    def compile_for(candidate: Candidate):
        remat.configure(model, candidate.settings)
        graphdef = split_model(model)[0]
        state = abstract_state(model, tx)
        shardings = offload_lib.state_shardings(state, candidate.offload)
        step_fn = offload_lib.wrap_step(functools.partial(train_step, cfg, graphdef, tx), candidate.offload)
        options = {**(compiler_options((state, cfg.compute_dtype)) or {}),
                   **(ANALYSIS_OPTIONS if analysis_only else {})}
        step = jax.jit(step_fn, donate_argnums=0,
                       in_shardings=(shardings, None) if shardings is not None else None,
                       out_shardings=(shardings, None) if shardings is not None else None,
                       compiler_options=options)
        return step.lower(state, batch).compile()

    return compile_for
