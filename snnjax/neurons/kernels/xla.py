"""The XLA implementation of the multi-step neuron: ``lax.scan`` with a hand-written backward.

The forward scans the recurrence of ``snnjax.neurons.base`` and stores H (``[T, ...]``
in the state dtype) as its residual; the backward is the reverse recurrence of the
design notes, a second ``lax.scan`` (``custom_vjp``). It runs on every backend, dtype
and layout: the SPMD partitioner shards it like any elementwise operation over the
trailing dims.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from snnjax.neurons import base as B


def unsupported_reason(cfg: B.NeuronConfig, shape, dtype) -> str | None:
    """Always None: this path runs every neuron variant on every input."""
    del cfg, shape, dtype
    return None


def multistep(cfg: B.NeuronConfig, x_seq: jax.Array, v_init=None, w=None, *, return_v_seq: bool = False):
    """``(spikes [T, ...], v)`` as ``snnjax.neurons.multistep``, through ``lax.scan``.

    ``v`` is the state sequence ``[T, ...]`` with ``return_v_seq``, else the final state ``[...]``.
    Gradients flow to ``x_seq``, ``v_init`` and PLIF's ``w``.
    """
    B.check_decay_param(cfg, w)
    v0 = B.broadcast_state(cfg, x_seq, v_init)
    return _multistep(cfg, return_v_seq, x_seq, v0, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _multistep(cfg, return_v_seq, x_seq, v0, w):
    out, _ = _forward(cfg, return_v_seq, x_seq, v0, w)
    return out


def _forward(cfg, return_v_seq, x_seq, v0, w):
    sdt = v0.dtype

    def body(v, x):
        h = B.charge(cfg, v, x.astype(sdt), w)
        s = B.fire(cfg, h)
        v = B.reset(cfg, h, s)
        return v, (s.astype(x_seq.dtype), h, v if return_v_seq else None)

    v_last, (spikes, h_seq, v_seq) = jax.lax.scan(body, v0, x_seq)
    out = (spikes, v_seq if return_v_seq else v_last)
    # x is needed again only for PLIF's dw with decay_input.
    x_res = x_seq if (cfg.kind == "PLIF" and cfg.decay_input) else None
    return out, (h_seq, x_res, v0, w)


def _bwd(cfg, return_v_seq, res, cts):
    h_seq, x_res, v0, w = res
    k = B.decay_rate(cfg, w)
    ds_seq, dv_out = cts
    sdt = h_seq.dtype
    x_dtype = ds_seq.dtype
    carry_factor = 1.0 if cfg.kind == "IF" else 1.0 - k  # dH_{t+1}/dV_t
    plif = cfg.kind == "PLIF"

    def grads_at(dv_carry, h, ds, dv_direct):
        dv = dv_carry if dv_direct is None else dv_carry + dv_direct
        g = B.fire_grad(cfg, h)
        s = B.fire(cfg, h)
        return ds.astype(sdt) * g + dv * B.dv_dh(cfg, h, s, g)

    if plif:
        v_prev = jnp.concatenate([v0[None], B.reset(cfg, h_seq[:-1], B.fire(cfg, h_seq[:-1]))])
    xs = (h_seq, ds_seq, dv_out if return_v_seq else None, v_prev if plif else None, x_res)

    def body(carry, inp):
        dv_carry, dk = carry
        h, ds, dv_direct, vp, x = inp
        dh = grads_at(dv_carry, h, ds, dv_direct)
        if plif:
            dh_dk = -(vp - cfg.vr) if x is None else x.astype(sdt) - (vp - cfg.vr)
            dk = dk + jnp.sum(dh * dh_dk)
        return (dh * carry_factor, dk), B.dx_from_dh(cfg, dh, k).astype(x_dtype)

    dv_start = jnp.zeros_like(v0) if return_v_seq else dv_out.astype(sdt)
    (dv0, dk), dx_seq = jax.lax.scan(body, (dv_start, jnp.zeros((), sdt)), xs, reverse=True)
    return dx_seq, dv0, B.plif_dw(cfg, w, dk)


_multistep.defvjp(_forward, _bwd)
