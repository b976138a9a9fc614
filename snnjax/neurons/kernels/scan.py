"""The ``scan`` implementation: any neuron's single step under ``lax.scan``, the backward from the step's VJP.

It runs every neuron: the built-in IF / LIF / PLIF (a ``NeuronConfig``: ``base.step``) and every neuron given by
its single step (a ``base.StepNeuron``: the catalogue's and any a user writes), on every backend; the SPMD
partitioner shards it like any elementwise operation over the trailing dims. The forward stores the state
before each step (``[T, ...]`` per state variable: one array for a neuron whose only state is V) and the
input; the backward (``custom_vjp``) is a reverse ``lax.scan`` that recomputes each step from its stored state
and pulls the cotangents through ``jax.vjp`` of the step, summing the parameters' gradients over time. So a
neuron written twice with the same operations (the docs' user LIF and ``LIFNode(impl="scan")``) gives the same
bits forward and backward. ``base.multistep_reference`` (plain autodiff of the whole scan) is the reference
the tests hold this and every other implementation to.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from snnjax.neurons import base as B


def unsupported_reason(cfg, shape, dtype) -> str | None:
    """Always None: this path runs every neuron on every input."""
    del cfg, shape, dtype
    return None


def multistep(neuron: B.NeuronConfig | B.StepNeuron, x_seq: jax.Array, v_init=None, w=None, *,
              return_v_seq: bool = False):
    """``(outs [T, ...] in x's dtype, v)`` as ``snnjax.neurons.multistep``.

    For a ``StepNeuron``, ``w`` is its params pytree and ``v`` the membrane potential sequence ``[T, ...]``
    with ``return_v_seq``, else the final state: the membrane potential ``[...]`` for a neuron whose only state
    it is, else the dict of every state variable. Gradients flow to ``x_seq``, ``v_init`` and ``w``.
    """
    if isinstance(neuron, B.NeuronConfig):
        B.check_decay_param(neuron, w)
        state0, single = {"v": B.broadcast_state(neuron, x_seq, v_init)}, True
    else:
        state0, single = B.start_states(neuron, x_seq, v_init), len(neuron.fresh) == 1
    outs, v_seq, last = run(neuron, x_seq, state0, w, return_v_seq=return_v_seq)
    return outs, (v_seq if return_v_seq else last["v"] if single else last)


def run(neuron: B.NeuronConfig | B.StepNeuron, x_seq: jax.Array, state0: dict, w, *, return_v_seq: bool):
    """``(outs [T, ...], v_seq [T, ...] or None, final state dict)`` from the start state dict ``state0`` (state
    dtype; ``{"v": V}`` for IF / LIF / PLIF). Differentiable in ``x_seq``, ``state0`` and ``w``."""
    if isinstance(neuron, B.NeuronConfig):
        B.check_decay_param(neuron, w)
        neuron, w = B.as_step_neuron(neuron, w), B.step_params(neuron, w)
    sdt = B.state_dtype(x_seq.dtype)

    def step(x, state, w):
        out, state = neuron.step(x.astype(sdt), state, w)
        return out.astype(x.dtype), state

    return _scan(step, return_v_seq, x_seq, state0, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _scan(step, return_v_seq, x_seq, state0, params):
    out, _ = _forward(step, return_v_seq, x_seq, state0, params)
    return out


def _forward(step, return_v_seq, x_seq, state0, params):
    def body(state, x):
        out, new = step(x, state, params)
        return new, (out, state, new["v"] if return_v_seq else None)

    last, (outs, before, v_seq) = jax.lax.scan(body, state0, x_seq)
    return (outs, v_seq, last), (x_seq, before, params)


def _backward(step, return_v_seq, res, cts):
    x_seq, before, params = res
    d_outs, d_v_seq, d_last = cts

    def body(carry, inp):
        d_state, d_params = carry
        x, state, d_out, d_vt = inp
        if d_vt is not None:  # the membrane potential after this step is an output too
            d_state = {**d_state, "v": d_state["v"] + d_vt}
        _, vjp = jax.vjp(step, x, state, params)
        dx, d_state, dp = vjp((d_out, d_state))
        return (d_state, jax.tree.map(jnp.add, d_params, dp)), dx

    carry0 = (d_last, jax.tree.map(jnp.zeros_like, params))
    (d_state0, d_params), dx = jax.lax.scan(body, carry0, (x_seq, before, d_outs, d_v_seq if return_v_seq else None),
                                            reverse=True)
    return dx, d_state0, d_params


_scan.defvjp(_forward, _backward)
