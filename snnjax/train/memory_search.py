"""The memory search: the fastest checkpointing / spike-storage / offload plan whose compiled peak fits a budget.

Nothing runs: each candidate's train step is compiled, and XLA's analyses of the compiled program give
its peak memory per device (``memory_analysis``: arguments + outputs not aliasing them + temporaries)
and its cost (``cost_analysis``: flops and bytes accessed, the speed estimate). Candidates are tried
from the presumed fastest on (``CANDIDATES``: recompute less first), and the search stops at the first
that fits: recomputation only adds work, so a later candidate is not faster by the compiled cost (each
compiled candidate's cost is recorded, so the order is checked where several are compiled).

    result = search(compile_for, budget_bytes=1.3e9)
    print(result.summary())

``compile_for(candidate)`` returns the compiled step for a ``Candidate`` (``step_compiler`` builds one
for a model and a batch shape).
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
from snnjax.train import offload as offload_lib
from snnjax.train.step import TrainState, split_model, train_step


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One plan: the model's memory settings and what is offloaded to host memory."""

    settings: remat.MemorySettings = remat.NONE
    offload: str = "none"

    def describe(self) -> str:
        return self.settings.describe() + (f", offload={self.offload}" if self.offload != "none" else "")


# Presumed fastest first: compression costs a cast, remat policies recompute more and more of each unit.
CANDIDATES: tuple[Candidate, ...] = tuple(
    Candidate(remat.settings(policy, storage))
    for policy, storage in (("none", "float"), ("none", "int8"), ("none", "bits"), ("dots_saveable", "bits"),
                            ("spikes", "bits"), ("units", "bits")))


@dataclasses.dataclass(frozen=True)
class Measured:
    """A compiled candidate: peak bytes per device, flops and bytes accessed per step, compile seconds."""

    candidate: Candidate
    peak_bytes: int
    temp_bytes: int
    flops: float
    bytes_accessed: float
    compile_s: float


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


def measure(compile_for: Callable[[Candidate], Any], candidate: Candidate) -> Measured:
    """Compile ``candidate`` and read its memory and cost analyses."""
    t0 = time.perf_counter()
    compiled = compile_for(candidate)
    seconds = time.perf_counter() - t0
    peak, temp = peak_bytes(compiled)
    flops, accessed = cost(compiled)
    return Measured(candidate, peak, temp, flops, accessed, seconds)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """The chosen candidate (None: none fits), every compiled candidate, the budget and the search time."""

    chosen: Measured | None
    tried: tuple[Measured, ...]
    budget_bytes: int
    optimize_ms: float

    def summary(self) -> str:
        mib = lambda b: f"{b / 2**20:,.1f} MiB"  # noqa: E731
        lines = [f"memory search: budget {mib(self.budget_bytes)}, {len(self.tried)} candidates compiled in "
                 f"{self.optimize_ms / 1e3:.2f} s"]
        for m in self.tried:
            mark = "*" if m is self.chosen else " "
            lines.append(f"  {mark} {m.candidate.describe():<48} peak {mib(m.peak_bytes):>14}  "
                         f"{m.flops / 1e9:10.2f} GFLOP  {'fits' if m.peak_bytes <= self.budget_bytes else 'over'}")
        lines.append("  chosen: " + (self.chosen.candidate.describe() if self.chosen else
                                     "nothing fits: the smallest peak is shown above"))
        return "\n".join(lines)


def search(compile_for: Callable[[Candidate], Any], budget_bytes: int,
           candidates: Sequence[Candidate] = CANDIDATES) -> SearchResult:
    """The first of ``candidates`` (presumed fastest first) whose compiled peak is at most ``budget_bytes``."""
    t0 = time.perf_counter()
    tried: list[Measured] = []
    chosen = None
    for c in candidates:
        m = measure(compile_for, c)
        tried.append(m)
        if m.peak_bytes <= budget_bytes:
            chosen = m
            break
    return SearchResult(chosen, tuple(tried), int(budget_bytes), (time.perf_counter() - t0) * 1e3)


def step_compiler(model, cfg, tx, batch: dict[str, Any]) -> Callable[[Candidate], Any]:
    """``compile_for(candidate)``: ``model``'s train step (``snnjax.train.step.train_step`` with ``cfg`` and
    optimizer ``tx``) configured as the candidate says, compiled for ``batch`` (arrays or
    ``jax.ShapeDtypeStruct``). ``model`` may be abstract (``nnx.eval_shape``); it is configured in place.
    """
    def compile_for(candidate: Candidate):
        remat.configure(model, candidate.settings)
        graphdef, params, rngs, rest = split_model(model)
        state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                           opt_state=jax.eval_shape(tx.init, params))
        state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
        shardings = offload_lib.state_shardings(state, candidate.offload)
        step_fn = offload_lib.wrap_step(functools.partial(train_step, cfg, graphdef, tx), candidate.offload)
        step = jax.jit(step_fn, donate_argnums=0,
                       in_shardings=(shardings, None) if shardings is not None else None,
                       out_shardings=(shardings, None) if shardings is not None else None,
                       compiler_options=compiler_options())
        return step.lower(state, batch).compile()

    return compile_for
