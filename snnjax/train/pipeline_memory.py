"""The memory search under a pipeline (``mode=pp``): the microbatch count and the checkpointing plan together.

A pipeline device holds, for each microbatch in flight on it, what its stage keeps for the backward. The
schedule fixes how many are in flight (about the stage count for 1F1B, every microbatch for GPipe), so
more microbatches shrink each (their size is batch / M) at the cost of more, less efficient ticks; and
checkpointing shrinks what each keeps at the cost of recomputing the forward.

Candidates: every valid microbatch count ``M`` (or the configured one) with each of the plans
``none`` + float spikes, ``none`` + bits and ``units`` + bits (every unit recomputed from its input), in
the order of their estimated step time: the pipeline's (``pipeline_plan.microbatch_options``: ticks x
(fixed cost + microbatch size)) times ``RECOMPUTE_FACTOR`` for ``units`` (the forward again: about a third
of a training step). They are compiled in that order, each as the real SPMD step over the whole mesh, and
the first whose compiled peak per device fits is chosen. For one plan (and offload) the peak falls as ``M``
grows (each microbatch in flight is smaller), so a miss at ``(M, plan)`` rules out, uncompiled, the same
plan with fewer microbatches. Nothing is assumed across plans: under zero-bubble, W's buffers hold each
weight layer's input and output cotangent under every checkpointing policy, so ``units`` + bits can
compile a few bytes above ``none`` + bits (``tests/test_memory_search.py`` checks the choice against
compiling every candidate, on real zero-bubble peaks).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from snnjax.models import remat
from snnjax.train import memory_search as ms
from snnjax.train.sharded import plan_step
from snnjax.train.step import split_model

PLANS = (remat.NONE, remat.settings("none", "bits"), remat.settings("units", "bits"))  # most kept first
RECOMPUTE_FACTOR = 4 / 3


@dataclasses.dataclass(frozen=True)
class PipelineCandidate(ms.Candidate):
    """A checkpointing plan (and offload) with the pipeline's microbatch count."""

    microbatches: int = 1

    def describe(self) -> str:
        return f"{self.microbatches} microbatches, " + super().describe()


def candidates(microbatch_times: Sequence[tuple[int, float]], offload: str = "none") -> list[PipelineCandidate]:
    """Every ``(M, estimated time)`` of ``microbatch_times`` with each of ``PLANS``, fastest first."""
    timed = [(t * (RECOMPUTE_FACTOR if s.default == "units" else 1.0), i, m)
             for m, t in microbatch_times for i, s in enumerate(PLANS)]
    return [PipelineCandidate(PLANS[i], offload, m) for _, i, m in sorted(timed)]


def search(cands: Sequence[PipelineCandidate], compile_for: Callable[[PipelineCandidate], Any],
           budget_bytes: int) -> ms.SearchResult:
    """The first of ``cands`` whose compiled peak fits ``budget_bytes``, skipping those a miss rules out (the same
    plan and offload with at most the missed microbatch count)."""
    t0 = time.perf_counter()
    tried, misses, chosen, compile_s = [], [], None, 0.0
    for c in cands:
        if any(c.microbatches <= m and (c.settings, c.offload) == plan for m, plan in misses):
            continue
        measured = ms.measure(compile_for, c)
        compile_s += measured.compile_s
        tried.append(measured)
        if measured.peak_bytes <= budget_bytes:
            chosen = measured
            break
        misses.append((c.microbatches, (c.settings, c.offload)))
    return ms.SearchResult(chosen, tuple(tried), int(budget_bytes), (time.perf_counter() - t0) * 1e3,
                           compile_s * 1e3, 1.0, len(cands))


def step_compiler(model, cfg, tx, batch: dict[str, Any], plan_for: Callable[[int], Any],
                  batch_shardings: Callable[[Any], dict[str, Any]]) -> Callable[[PipelineCandidate], Any]:
    """``compile_for(candidate)``: ``model``'s train step under ``plan_for(candidate.microbatches)`` (a pp
    ``Plan``) configured as the candidate says, compiled for the global ``batch`` (``jax.ShapeDtypeStruct``)
    with ``batch_shardings(plan)``, for its memory and cost analyses."""
    def compile_for(candidate: PipelineCandidate):
        plan = plan_for(candidate.microbatches)
        remat.configure(model, candidate.settings)
        state = ms.abstract_state(model, tx)
        if plan.packing is not None:
            state = jax.eval_shape(plan.packing.pack_state, state)
        _, step = plan_step(plan, state, cfg, split_model(model)[0], tx, batch_shardings=batch_shardings(plan),
                            offload=candidate.offload, compiler_options=ms.ANALYSIS_OPTIONS)
        return step.lower(state, batch).compile()

    return compile_for
