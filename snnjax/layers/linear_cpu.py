"""A linear layer's product on XLA:CPU (``Linear`` / ``linear_general``'s ``dot_general`` hook): for spike inputs,
the sparse-input matmul.

A linear layer after a spiking layer reads 0/1 spikes, or small counts on a transformer's residual stream, mostly
zeros (QKFormer's projections at initialisation: 3% ones after a neuron, 7-18% nonzero on the stream). Where at
most ``sparse_conv.MAX_DENSITY`` of the input is nonzero (decided per call with a ``lax.cond``), the forward and
the kernel gradient run ``sparse_conv``'s matmul kernels, whose work scales with the nonzeros; the input gradient
(a dense cotangent) stays XLA's dot. As for the convolutions (``conv_cpu.sparse_refusal``): on one device, float32 /
float64, at least ``sparse_conv.MIN_IN_CHANNELS`` inputs and outputs a multiple of 8; ``print(plan)`` says which
linear layers take it.

Measured on the 2-core development CPU (float32, milliseconds, forward / kernel gradient, XLA's dot against these
kernels): ``[128, 1536] -> 384`` at 3% ones 1.03 / 1.26 against 0.32 / 0.43; ``[128, 384] -> 1536`` at 15% 1.54 /
1.07 against 0.37 / 0.44; ``[2048, 96] -> 384`` at 10% 0.84 / 1.07 against 0.42 / 0.51; at 40% ones 0.90 / 1.45
against 1.12 / 1.21 (level over both).

Sums run in another order than XLA's dot and skip zeros exactly, as ``sparse_conv``'s docstring says.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from snnjax.layers import conv_cpu, sparse_conv
from snnjax.parallel import conv_paths


def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None, preferred_element_type=None,
                out_sharding=None) -> jax.Array:
    """Drop-in ``lax.dot_general`` for a linear layer: ``sparse_matmul`` on the CPU backend where ``lhs``'s trailing
    dims contract with ``rhs``'s leading ones (no batch dims) and ``conv_cpu.sparse_refusal`` allows it (decided at
    trace time, recorded for ``print(plan)``); else ``lax.dot_general`` unchanged."""
    (lhs_contract, rhs_contract), batch = dimension_numbers
    k = len(lhs_contract)
    ours = (jax.default_backend() == "cpu" and not any(batch) and out_sharding is None and 0 < k < lhs.ndim
            and k < rhs.ndim and tuple(lhs_contract) == tuple(range(lhs.ndim - k, lhs.ndim))
            and tuple(rhs_contract) == tuple(range(k)))
    if ours:
        rows, cin, cout = math.prod(lhs.shape[:-k]), math.prod(lhs.shape[-k:]), math.prod(rhs.shape[k:])
        # the convolutions' rules, for this product as the 1 x 1 convolution it is
        refusal = conv_cpu.sparse_refusal((rows, 1, 1, cin), (1, 1, cin, cout), lhs.dtype, rhs.dtype,
                                          preferred_element_type, (1, 1), ((0, 0), (0, 0)))
        conv_paths.record((rows, cin), (cin, cout), "xla" if refusal else "sparse", refusal or conv_cpu.SPARSE_PATH)
        if refusal is None:
            y = sparse_matmul(lhs.reshape(rows, cin), rhs.reshape(cin, cout), precision)
            return y.reshape(*lhs.shape[:-k], *rhs.shape[k:])
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type, out_sharding=out_sharding)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def sparse_matmul(x: jax.Array, w: jax.Array, precision=None) -> jax.Array:
    """``x [rows, C_in] @ w [C_in, C_out]`` (one dtype): ``sparse_conv``'s kernels for the forward and the kernel
    gradient where at most ``sparse_conv.MAX_DENSITY`` of ``x`` is nonzero (decided per call), else XLA's dots."""
    return _forward(x, w, precision)[0]


def _dense(x, w, precision):
    return jnp.dot(x, w, precision=precision)


def _forward(x, w, precision):
    takes = conv_cpu.takes_sparse(x)
    return lax.cond(takes, sparse_conv.matmul, functools.partial(_dense, precision=precision), x, w), takes


def _fwd(x, w, precision):
    y, takes = _forward(x, w, precision)
    return y, (x, w, takes)


def _bwd(precision, res, g):
    x, w, takes = res
    dx = _dense(g, w.T, precision).astype(x.dtype)
    dw = lax.cond(takes, sparse_conv.matmul_weight_grad,
                  lambda x, g: lax.dot_general(x, g, (((0,), (0,)), ((), ())), precision=precision).astype(w.dtype),
                  x, g)
    return dx, dw


sparse_matmul.defvjp(_fwd, _bwd)
