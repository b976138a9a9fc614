"""A backward pass cut into its input-gradient part (B) and its weight-gradient part (W), for zero-bubble pipelines.

    bw = split(jax.make_jaxpr(backward)(residuals, cotangent), num_weight_grads=n, direct=params_mask)
    *input_grads, *stored = bw.run_b(*residuals, cotangent)        # at B
    weight_grads = bw.run_w(stored, [residuals[i] for i in bw.direct_inputs])  # at W, ticks later

``backward``'s outputs are the ``n`` weight gradients first, then the input gradients. B runs every
equation the input gradients need, and the weight-gradient equations that are cheap (bias and
BatchNorm reductions); W runs the weight-gradient contractions (``dot_general`` and
``conv_general_dilated`` that the input gradients do not need) and whatever consumes their
results. What W reads is stored by B: for a convolution, its input and its output cotangent —
not the rest of the stage's residuals (neuron state, BatchNorm inputs), which only the
input-gradient chain uses. So W neither re-runs the forward nor the cotangent chain, and the
microbatches waiting for their W hold two arrays per weight layer.

``direct`` marks the backward's inputs W may take again at W time instead of having them stored
(the parameters, which do not change within a step).

Under activation checkpointing (``snnjax.models.remat``) the backward is mostly ``remat`` equations
whose bodies recompute a unit's forward and run its backward; jitted helpers and custom derivative
rules nest bodies too. ``split`` first inlines every such body (``inline``), so the weight-gradient
contractions inside them reach W under every policy. The recomputation stays a recomputation: it
reads the kept residuals plus zero times a cotangent element (``snnjax.layers.residuals.after``), so
XLA can neither run it before the backward reaches the unit nor merge it with the forward.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.extend import core

HEAVY = frozenset({"dot_general", "conv_general_dilated"})
# Equations whose bodies ``inline`` flattens into their jaxpr: checkpointing, jit, calls and custom derivative rules
# (a backward only evaluates these; it is never differentiated again).
NESTED = frozenset({"remat2", "checkpoint", "pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
                    "custom_vjp_call", "custom_vjp_call_jaxpr"})
SMALL_BYTES = 256  # scalars and the like, which do not count when deciding where a step runs


@dataclasses.dataclass(frozen=True, eq=False)
class BackwardSplit:
    """The two halves of one backward pass (``split``)."""

    b: core.ClosedJaxpr  # (inputs...) -> (input grads..., stored...)
    w: core.ClosedJaxpr  # (stored..., direct inputs...) -> weight grads
    num_b_outputs: int
    direct_inputs: tuple[int, ...]  # the backward inputs W reads directly, in W's order

    @property
    def stored(self) -> list[jax.ShapeDtypeStruct]:
        """What B hands to W, as shapes."""
        return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.b.out_avals[self.num_b_outputs:]]

    def run_b(self, *inputs) -> tuple[list, list]:
        """``(input grads, stored)``."""
        out = core.jaxpr_as_fun(self.b)(*inputs)
        return list(out[:self.num_b_outputs]), list(out[self.num_b_outputs:])

    def run_w(self, stored: Sequence, direct: Sequence) -> list:
        """The weight gradients from what B stored and the direct inputs (``direct_inputs`` order)."""
        return list(core.jaxpr_as_fun(self.w)(*stored, *direct))


def _body(eqn) -> tuple[core.Jaxpr, Sequence] | None:
    """``(jaxpr, consts)`` of an equation ``inline`` flattens, else None."""
    if eqn.primitive.name not in NESTED:
        return None
    body = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if isinstance(body, core.ClosedJaxpr):
        return body.jaxpr, body.consts
    if isinstance(body, core.Jaxpr):
        return body, ()
    raise NotImplementedError(f"weight_split cannot inline {eqn.primitive.name}: no jaxpr among its parameters "
                              f"{sorted(eqn.params)}")


def _evaluate(jaxpr: core.Jaxpr, consts: Sequence, args: Sequence) -> list:
    """``jaxpr`` on ``args``, the bodies of ``NESTED`` equations evaluated in line (recursively)."""
    env = dict(zip(jaxpr.constvars, consts, strict=True)) | dict(zip(jaxpr.invars, args, strict=True))
    read = lambda v: v.val if isinstance(v, core.Literal) else env[v]  # noqa: E731
    for e in jaxpr.eqns:
        ins = [read(v) for v in e.invars]
        body = _body(e)
        if body is not None:
            outs = _evaluate(*body, ins)
        else:
            outs = e.primitive.bind(*ins, **e.primitive.get_bind_params(e.params))
            outs = outs if e.primitive.multiple_results else [outs]
        env.update(zip(e.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def inline(closed: core.ClosedJaxpr) -> core.ClosedJaxpr:
    """``closed`` with the bodies of its checkpoint, jit, call and custom-derivative equations inlined (recursively):
    one level of equations computing the same values."""
    if not any(_body(e) is not None for e in closed.jaxpr.eqns):
        return closed
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
    return jax.make_jaxpr(lambda *args: _evaluate(closed.jaxpr, closed.consts, args))(*avals)


def _needed(eqns, outvars) -> list[bool]:
    """Which equations ``outvars`` depend on (a dead-code pass over one level of the jaxpr)."""
    need = {v for v in outvars if isinstance(v, core.Var)}
    keep = [False] * len(eqns)
    for i in reversed(range(len(eqns))):
        e = eqns[i]
        if e.effects or any(v in need for v in e.outvars):
            keep[i] = True
            need.update(v for v in e.invars if isinstance(v, core.Var))
    return keep


def _nbytes(v) -> int:
    return math.prod(v.aval.shape) * np.dtype(v.aval.dtype).itemsize


def _sink(eqns, in_b, for_w, in_w, w_out, free) -> None:
    """Move into W (``in_w``, in place) the steps that only prepare W's operands (transposes, unpacking
    compressed spikes) where W then stores no more bytes: it keeps the array they start from instead.
    ``free``: variables W has without storing them."""
    readers = collections.defaultdict(set)  # live equations reading each variable
    for i, e in enumerate(eqns):
        for v in e.invars if in_b[i] or for_w[i] else ():
            if isinstance(v, core.Var):
                readers[v].add(i)
    w_defined = {v for i, e in enumerate(eqns) if in_w[i] for v in e.outvars}
    reads = {v for i, e in enumerate(eqns) if in_w[i] for v in e.invars if isinstance(v, core.Var)}
    reads = {v for v in reads | {v for v in w_out if isinstance(v, core.Var)} if v not in w_defined and v not in free}
    for i in reversed(range(len(eqns))):
        e = eqns[i]
        if in_w[i] or in_b[i] or not for_w[i] or e.effects:
            continue
        if not all(v in reads and all(in_w[j] for j in readers[v]) for v in e.outvars):
            continue
        new = {v for v in e.invars if isinstance(v, core.Var) and v not in reads and v not in free}
        if sum(n for n in map(_nbytes, new) if n > SMALL_BYTES) <= sum(map(_nbytes, e.outvars)):
            in_w[i] = True
            reads = (reads - set(e.outvars)) | new


def _jaxpr(constvars, invars, outvars, eqns, name: str) -> core.Jaxpr:
    info = core.DebugInfo(f"weight_split {name}", None, tuple(f"in{i}" for i in range(len(invars))),
                          tuple(f"out{i}" for i in range(len(outvars))))
    return core.Jaxpr(constvars, invars, outvars, eqns, frozenset().union(*(e.effects for e in eqns)), info)


def split(closed: core.ClosedJaxpr, num_weight_grads: int, direct: Sequence[bool]) -> BackwardSplit:
    """Cut ``closed`` (outputs: ``num_weight_grads`` weight gradients, then input gradients) into B and W.

    ``direct[i]``: input ``i`` need not be stored for W (W gets it again). Equations with effects stay in B.
    Nested bodies (checkpointing, jit, custom derivative rules) are inlined first (``inline``).
    """
    closed = inline(closed)
    jaxpr = closed.jaxpr
    eqns = jaxpr.eqns
    w_out, b_out = list(jaxpr.outvars[:num_weight_grads]), list(jaxpr.outvars[num_weight_grads:])
    in_b, for_w = _needed(eqns, b_out), _needed(eqns, w_out)
    # A contraction that feeds another contraction is part of the cotangent chain (B); the last ones before the
    # weight gradients are the weight-gradient contractions (W), with everything downstream of them.
    feeds, feeds_heavy = set(), [False] * len(eqns)
    for i in reversed(range(len(eqns))):
        e = eqns[i]
        feeds_heavy[i] = any(v in feeds for v in e.outvars)
        if feeds_heavy[i] or e.primitive.name in HEAVY:
            feeds.update(v for v in e.invars if isinstance(v, core.Var))
    in_w, w_defined = [False] * len(eqns), set()
    for i, e in enumerate(eqns):
        if for_w[i] and not in_b[i] and not e.effects and not feeds_heavy[i] and (
                e.primitive.name in HEAVY or any(v in w_defined for v in e.invars if isinstance(v, core.Var))):
            in_w[i] = True
            w_defined.update(e.outvars)
    direct_vars = {v for v, d in zip(jaxpr.invars, direct, strict=True) if d}
    _sink(eqns, in_b, for_w, in_w, w_out, set(jaxpr.constvars) | direct_vars)
    w_defined = {v for i, e in enumerate(eqns) if in_w[i] for v in e.outvars}
    b_eqns = [e for i, e in enumerate(eqns) if (in_b[i] or for_w[i]) and not in_w[i]]
    w_eqns = [e for i, e in enumerate(eqns) if in_w[i]]

    const_set = set(jaxpr.constvars)
    stored, w_consts, w_direct, seen = [], [], [], set()
    for v in [u for e in w_eqns for u in e.invars] + w_out:
        if not isinstance(v, core.Var) or v in w_defined or v in seen:
            continue
        seen.add(v)
        if v in const_set:
            w_consts.append(v)
        elif v in direct_vars:
            w_direct.append(v)
        else:
            stored.append(v)
    consts = dict(zip(jaxpr.constvars, closed.consts, strict=True))
    b = core.ClosedJaxpr(_jaxpr(jaxpr.constvars, jaxpr.invars, b_out + stored, b_eqns, "B"), closed.consts)
    w = core.ClosedJaxpr(_jaxpr(w_consts, stored + w_direct, w_out, w_eqns, "W"), [consts[v] for v in w_consts])
    index = {v: i for i, v in enumerate(jaxpr.invars)}
    return BackwardSplit(b, w, len(b_out), tuple(index[v] for v in w_direct))
