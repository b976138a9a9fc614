"""Run one multi-step neuron implementation with its VJP, and measure how far two runs are apart.

Shared by the tests (every implementation against the path it replaces) and by
``python -m snnjax.bench.pallas_check`` (the compiled kernels against the XLA path on a GPU).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import numpy as np

from snnjax.neurons import base as B
from snnjax.neurons.kernels import dispatch

REFERENCE = "reference"  # plain autodiff through ``base.multistep_reference`` (``base.scan_steps``)
IMPLS = (*dispatch.IMPLS, REFERENCE)


@functools.cache
def implementation(impl: str) -> Callable:
    """``f(cfg, x_seq, v_init, w, *, return_v_seq)`` of ``impl`` (one object per name, a stable jit-static key).

    ``impl`` is ``"reference"`` or a name of ``dispatch.IMPLS``, run through ``dispatch.multistep``
    (so an implementation that cannot run a call raises ValueError saying why).
    """
    if impl == REFERENCE:
        return B.multistep_reference
    if impl not in dispatch.IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return functools.partial(dispatch.multistep, impl=impl)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def run_vjp(impl: str | Callable, cfg: B.NeuronConfig, return_v_seq: bool, x, v_init, w, ct_s, ct_v):
    """``((spikes, v), (dx, dv_init, dw))``: the outputs of ``impl`` and their VJP for cotangents ``(ct_s, ct_v)``.

    ``impl``: a name (``implementation``), or a multistep function itself, e.g. the Pallas kernels
    with chosen options, ``functools.partial(snnjax.neurons.kernels.pallas.multistep, options=...)`` (hashable; a new
    object compiles anew). ``x``, ``ct_s`` and ``spikes`` are ``[T, ...]``; ``v`` and ``ct_v`` are
    ``[T, ...]`` with ``return_v_seq``, else ``[...]``; ``dv_init`` / ``dw`` are None where ``v_init`` / ``w`` are.
    """
    multistep = implementation(impl) if isinstance(impl, str) else impl
    out, vjp = jax.vjp(functools.partial(multistep, cfg, return_v_seq=return_v_seq), x, v_init, w)
    return out, vjp((ct_s, ct_v))


def rel_error(got, want, floor: float = 0.0) -> float:
    """Normwise relative difference ``||got - want|| / max(||got||, ||want||, floor)``.

    0 when all three are zero (equal arrays give 0 exactly); inf for different shapes.
    """
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    denom = max(float(np.linalg.norm(got)), float(np.linalg.norm(want)), floor)
    diff = float(np.linalg.norm(got - want))
    return diff / denom if denom > 0 else diff


def differences(got, want) -> dict[str, float]:
    """How far a ``run_vjp`` result ``got`` is from ``want``.

    ``spike_mismatch``: the fraction of spikes that differ; ``v``, ``dx``, ``dv_init``, ``dw``:
    ``rel_error`` of each (a gradient that is None in both is left out, None in one is inf).
    """
    (s_got, v_got), grads_got = got
    (s_want, v_want), grads_want = want
    s_got, s_want = np.asarray(s_got, np.float64), np.asarray(s_want, np.float64)
    out = {"spike_mismatch": float(np.mean(s_got != s_want)) if s_got.shape == s_want.shape else float("inf"),
           "v": rel_error(v_got, v_want)}
    for name, g, h in zip(("dx", "dv_init", "dw"), grads_got, grads_want, strict=True):
        if g is not None or h is not None:
            out[name] = float("inf") if g is None or h is None else rel_error(g, h)
    return out
