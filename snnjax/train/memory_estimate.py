"""Peak memory of a train step per checkpointing plan, estimated from traced programs (nothing compiled).

Each model unit's forward + backward is traced once per policy (``jax.make_jaxpr``, milliseconds); a
liveness pass over the jaxpr gives the unit's peak bytes while its backward runs, and its VJP's residuals
give the bytes it keeps from the forward to the backward. The step's peak is then

    base + max over units u of ( sum of kept(v) over the units v before u  +  peak(u) )

where ``base`` is what lives through the whole step (parameters, gradients, optimizer and model state, the
batch): when the backward reaches unit ``u``, every earlier unit still holds its residuals and ``u`` runs
its own backward (recomputing its forward first under a checkpoint policy). Elementwise chains count
as separate values here while XLA fuses them, so the liveness peak tends to be above the compiled one;
``memory_search`` compiles the chosen plan and reads its true peak.

Units whose modules have the same structure (graph definitions) and whose inputs have the same shape are
the same program (a transformer's blocks) and are traced once.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.models import remat
from snnjax.parallel.variables import fresh

POLICIES = ("none", "units")  # what the search chooses per unit (spikes and dots_saveable keep about as much)


def nbytes(aval) -> int:
    """Bytes of an abstract value (0 for tokens and other non-arrays)."""
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    itemsize = getattr(dtype, "itemsize", None)  # PRNG key dtypes have one too
    return math.prod(shape) * (itemsize if itemsize is not None else jnp.dtype(dtype).itemsize)


def _subjaxprs(eqn) -> list:
    out = []
    for v in eqn.params.values():
        for item in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                out.append(item.jaxpr)
            elif isinstance(item, jax.extend.core.Jaxpr):
                out.append(item)
    return out


# Primitives XLA fuses into their consumers (loop fusion): a value such an op makes and only such ops use is
# computed inside its consumers' loops and never held in memory.
ELEMENTWISE = frozenset("""
    abs add and broadcast_in_dim ceil clamp concatenate convert_element_type copy cos div eq erf exp exp2 expand_dims
    floor ge gt integer_pow iota is_finite le log log1p logistic lt max min mul ne neg not or pad pow rem reshape
    round rsqrt select_n shift_left shift_right_logical sign sin slice sqrt square squeeze stop_gradient sub tanh xor
    """.split())


REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin"})  # fuse their producers


def _elementwise(eqn) -> bool:
    """An ``ELEMENTWISE`` op, or a call (``jnp.where`` is one) of nothing else."""
    if eqn.primitive.name in ELEMENTWISE:
        return True
    subs = _subjaxprs(eqn) if eqn.primitive.name in ("jit", "pjit") else []
    return bool(subs) and all(_elementwise(q) for sub in subs for q in sub.eqns)


def _fused(jaxpr) -> set:
    """The values of ``jaxpr`` an elementwise op makes and only elementwise ops and reductions use (not its
    outputs)."""
    uses: dict[Any, list[Any]] = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if not isinstance(v, jax.extend.core.Literal):
                uses.setdefault(v, []).append(eqn)
    outputs = {v for v in jaxpr.outvars if not isinstance(v, jax.extend.core.Literal)}
    return {v for eqn in jaxpr.eqns if _elementwise(eqn) for v in eqn.outvars
            if v not in outputs and uses.get(v)
            and all(u.primitive.name in REDUCTIONS or _elementwise(u) for u in uses[v])}


def live_peak(jaxpr) -> int:
    """Peak bytes live while ``jaxpr`` runs in program order: its inputs, every value from its definition
    to its last use, its outputs to the end, and the transients inside nested jaxprs (calls, checkpoints,
    custom derivative rules, loop bodies). Values that XLA would fuse away (``ELEMENTWISE`` chains) take no
    memory."""
    last: dict[Any, int] = {}
    n = len(jaxpr.eqns)
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, jax.extend.core.Literal):
                last[v] = i
    for v in jaxpr.outvars:
        if not isinstance(v, jax.extend.core.Literal):
            last[v] = n
    fused = _fused(jaxpr)
    size = lambda v: 0 if v in fused else nbytes(v.aval)  # noqa: E731
    inputs = {*jaxpr.invars, *jaxpr.constvars}
    live = sum(nbytes(v.aval) for v in inputs)
    peak = live
    for i, eqn in enumerate(jaxpr.eqns):
        out = sum(size(v) for v in eqn.outvars)
        inner = 0
        for sub in _subjaxprs(eqn):
            edge = sum(nbytes(v.aval) for v in (*sub.invars, *sub.outvars))
            inner = max(inner, live_peak(sub) - edge)
        peak = max(peak, live + out + inner)
        live += sum(size(v) for v in eqn.outvars if v in last)
        for v in {v for v in eqn.invars if not isinstance(v, jax.extend.core.Literal)}:
            if last.get(v) == i and v not in inputs:
                live -= size(v)
    return peak


@dataclasses.dataclass(frozen=True)
class UnitMemory:
    """One unit under one policy: the bytes it keeps from forward to backward, its peak while its backward
    runs (its input and output cotangent included), and its forward flops (what recomputation costs)."""

    name: str
    policy: str
    kept: int
    peak: int
    flops: float


def _flops(jaxpr) -> float:
    """Multiply-add flops of the convolutions and matmuls in ``jaxpr`` (nested jaxprs included)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lc)
        elif name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature, in feature, spatial...)
            per_out = math.prod(rhs[d] for d in spec[1:])
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * per_out
        for sub in _subjaxprs(eqn):
            total += _flops(sub)
    return total


def profile_units(model: nnx.Module, input_spec: jax.ShapeDtypeStruct, spike_residuals: str = "float",
                  policies: Sequence[str] = POLICIES) -> list[dict[str, UnitMemory]]:
    """Per unit of ``model`` (in order), its ``UnitMemory`` under each of ``policies`` with
    ``spike_residuals`` storage, for an input batch like ``input_spec``. ``model`` may be abstract
    (``nnx.eval_shape``); its memory settings are restored afterwards."""
    before = remat.memory_settings(model)
    try:
        return _profile(model, input_spec, spike_residuals, policies)
    finally:
        remat.configure(model, before)


def _submodule(model: nnx.Module, path: str) -> nnx.Module:
    for part in path.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def _profile(model, input_spec, storage, policies):
    names = [u.name for u in model.units()]
    out: list[dict[str, UnitMemory]] = [{} for _ in names]
    cache: dict[tuple, tuple[int, int, float, jax.ShapeDtypeStruct]] = {}
    for policy in policies:
        remat.configure(model, remat.MemorySettings(policy, (), storage))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        x = input_spec
        for i, name in enumerate(names):
            def run(p, r, x, i=i, graphdef=graphdef):
                return nnx.merge(graphdef, p, fresh(r)).units()[i](x)

            # the owned modules' structure and shapes (with their settings) and the input decide the program
            owned = tuple(nnx.graphdef(_submodule(model, path)) for path in model.units()[i].owns)
            key = (policy, name.rstrip("0123456789"), owned, x.shape, str(x.dtype))
            if key not in cache:
                cache[key] = _trace_unit(run, params, rest, x)
            kept, peak, flops, x = cache[key]
            out[i][policy] = UnitMemory(name, policy, kept, peak, flops)
    return out


def _trace_unit(run, params, rest, x) -> tuple[int, int, float, jax.ShapeDtypeStruct]:
    """``(kept bytes, peak bytes, forward flops, output)`` of one unit: its VJP's residuals (parameters
    excluded), the liveness peak of its forward + backward less parameters and their gradients, the flops
    of its forward (the primal part of the VJP's trace) and the shape of its output."""
    def forward(p, r, x):
        return jax.vjp(lambda p, x: run(p, r, x), p, x)

    def forward_backward(p, r, x, ct):
        _, vjp = forward(p, r, x)
        return vjp(ct)

    fwd = jax.make_jaxpr(forward)(params, rest, x).jaxpr
    y = fwd.outvars[0].aval
    n_params = len(jax.tree.leaves(params))
    inputs = set(fwd.invars[:n_params])
    kept, seen = 0, set()
    for v in fwd.outvars[1:]:
        if isinstance(v, jax.extend.core.Literal) or v in inputs or v in seen:
            continue
        seen.add(v)
        kept += nbytes(v.aval)
    y = jax.ShapeDtypeStruct(y.shape, y.dtype)
    both = jax.make_jaxpr(forward_backward)(params, rest, x, y).jaxpr
    param_bytes = sum(nbytes(v.aval) for v in both.invars[:n_params])
    grads = sum(nbytes(v.aval) for v in both.outvars[:n_params])
    return kept, live_peak(both) - param_bytes - grads, _flops(fwd), y


def state_bytes(state: Any) -> int:
    """Bytes of a pytree of arrays or ``ShapeDtypeStruct``."""
    return sum(nbytes(x) for x in jax.tree.leaves(state))


def estimate(units: Sequence[dict[str, UnitMemory]], policies: Sequence[str], base: int) -> int:
    """The step's peak bytes when unit ``i`` uses ``policies[i]`` (see the module docstring)."""
    peak, kept = 0, 0
    for unit, policy in zip(units, policies, strict=True):
        peak = max(peak, kept + unit[policy].peak)
        kept += unit[policy].kept
    return base + max(peak, kept)


def step_base_bytes(state: Any, batch: Any) -> int:
    """What lives through a whole train step: the train state (parameters, optimizer and model state), the
    parameters' gradients and the batch."""
    return state_bytes(state) + state_bytes(getattr(state, "params", None)) + state_bytes(batch)
