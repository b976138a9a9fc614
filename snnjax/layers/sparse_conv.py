"""A CPU convolution and matmul whose work scales with the input's nonzeros: for inputs that are spikes.

A convolution after a spiking layer reads 0/1 spikes (or small counts, after a SEW ``ADD``), of which 3-20% are
ones in the zoo's models. ``forward`` and ``weight_grad`` (``sparse_conv.cc``, an XLA FFI call) list the input's
nonzeros, then sum only their products: the forward adds ``v * w[i, j, c, :]`` per nonzero ``(c, v)`` of each
input position into each output position's accumulators; the kernel gradient sums ``v * g[p, :]`` into
``dw[i, j, c, :]`` per channel and tap, in registers, over a copy of the output gradient that stays in cache. The
input gradient has no such saving (the output gradient is dense) and stays XLA's.

Measured on the 2-core development CPU (AVX-512, float32, ``N*T = 32``, 3 x 3 kernels, stride 1; CPU ms of both
cores against XLA's Eigen convolution, forward / kernel gradient, ``python -m snnjax.bench.conv --impls xla sparse
--density 0.15``): at 15% ones ``24 x 24, 256 -> 256`` 78 / 76 against 217 / 239, ``12 x 12, 512 -> 512`` 70 / 72
against 212 / 212, ``48 x 48, 64 -> 128`` 64 / 59 against 125 / 151; all of CIFAR10DVSVGG's convolutions with
their input gradients 1.25x faster than XLA's at 30% ones and level at 47% (an average-pooled spike map). So
``conv_cpu`` takes it when at most ``MAX_DENSITY`` of an input is nonzero, decided per call on the values
(``lax.cond``).

``matmul`` / ``matmul_weight_grad`` are the same for a linear layer (``x [rows, C_in] @ w [C_in, C_out]``): the
forward sums each row's nonzeros' kernel rows, the kernel gradient lists the nonzeros per input column and sums
``v * g[r, :]`` over them; ``linear_cpu`` takes them under the same rule.

The sums run in another order than XLA's (float32 results within 1e-6 of the largest output, float64 within
1e-13 in the tests), and skip zeros exactly: a zero input times an infinite or NaN weight adds nothing here where a
dense convolution makes it NaN (a NaN or infinite input propagates as in XLA's). Shapes as ``conv_cpu``:
``x [N, H, W, C_in]``, ``w [kh, kw, C_in, C_out]``; float32 or float64, ``C_out`` a multiple of 8; any strides and
padding.
"""
from __future__ import annotations

import functools
import pathlib
from collections.abc import Sequence

import jax
import numpy as np

from snnjax.cpp import build

MAX_DENSITY = 0.4  # the largest fraction of nonzero inputs that takes this path (the two are level near 0.45)
# The fewest input channels it takes: with few nonzeros per position the kernel gradient reads the output gradient
# once per tap for little work (CIFAR10DVSVGG's first convolution, 2 -> 64 channels at 15% ones: 26 CPU ms against
# XLA's 7; 64 -> 128: 119 against 196).
MIN_IN_CHANNELS = 32
_SOURCE = pathlib.Path(__file__).with_name("sparse_conv.cc")
_TARGETS = {"forward": {"float32": "SnnSparseConvForwardF32", "float64": "SnnSparseConvForwardF64"},
            "weight_grad": {"float32": "SnnSparseConvWeightGradF32", "float64": "SnnSparseConvWeightGradF64"},
            "matmul": {"float32": "SnnSparseMatmulF32", "float64": "SnnSparseMatmulF64"},
            "matmul_weight_grad": {"float32": "SnnSparseMatmulWeightGradF32",
                                   "float64": "SnnSparseMatmulWeightGradF64"}}


@functools.cache
def _load() -> None:
    # -ffp-contract=fast: the accumulations are FMAs (the library's other kernels keep XLA's rounding instead)
    build.build_library("sparse_conv", "sparse-input CPU convolution", (_SOURCE, build.INCLUDE / "parallel_chunks.h"),
                        [t for per_dtype in _TARGETS.values() for t in per_dtype.values()],
                        extra=("-ffp-contract=fast",))


def available() -> bool:
    """Whether the kernels are (or can be) built and loaded here (a C++ compiler; see ``native.build``)."""
    try:
        _load()
    except build.NativeBuildError as e:
        _warn_once(str(e))
        return False
    return True


@functools.cache
def _warn_once(message: str) -> None:
    build.log.warning("sparse-input CPU convolution unavailable, using XLA's: %s", message)


def supports(x_dtype, w_dtype, in_channels: int, out_channels: int) -> bool:
    """Whether these kernels take a convolution of these dtypes and channels (the build aside): float32 or
    float64, at least ``MIN_IN_CHANNELS`` in, a multiple of 8 out."""
    return (x_dtype == w_dtype and np.dtype(x_dtype).name in _TARGETS["forward"] and in_channels >= MIN_IN_CHANNELS
            and out_channels % 8 == 0)


def _attrs(strides: Sequence[int], padding: Sequence[tuple[int, int]]) -> dict:
    return {"stride_h": np.int64(strides[0]), "stride_w": np.int64(strides[1]),
            "pad_h": np.int64(padding[0][0]), "pad_w": np.int64(padding[1][0])}


def _call(op: str, shape: Sequence[int], x: jax.Array, operand: jax.Array, **attrs) -> jax.Array:
    """The FFI call of kernel ``op`` (a ``_TARGETS`` key) on ``(x, operand)``, returning ``shape`` in ``x``'s dtype."""
    _load()
    call = jax.ffi.ffi_call(_TARGETS[op][x.dtype.name], jax.ShapeDtypeStruct(tuple(shape), x.dtype),
                            vmap_method="sequential")
    return call(x, operand, **attrs)


def forward(x: jax.Array, w: jax.Array, out_hw: tuple[int, int], strides: Sequence[int],
            padding: Sequence[tuple[int, int]]) -> jax.Array:
    """``[N, H_out, W_out, C_out]`` (``out_hw`` the output's spatial size, which sets the trailing padding)."""
    return _call("forward", (x.shape[0], *out_hw, w.shape[3]), x, w, **_attrs(strides, padding))


def weight_grad(x: jax.Array, g: jax.Array, w_shape: Sequence[int], strides: Sequence[int],
                padding: Sequence[tuple[int, int]]) -> jax.Array:
    """``dL/dw [kh, kw, C_in, C_out]`` from the input ``x`` and the output's cotangent ``g`` (in ``x``'s dtype)."""
    return _call("weight_grad", w_shape, x, g.astype(x.dtype), **_attrs(strides, padding))


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x [rows, C_in] @ w [C_in, C_out]`` -> ``[rows, C_out]`` (a linear layer on spikes: ``linear_cpu``)."""
    return _call("matmul", (x.shape[0], w.shape[1]), x, w)


def matmul_weight_grad(x: jax.Array, g: jax.Array) -> jax.Array:
    """``x.T @ g`` -> ``[C_in, C_out]``: ``matmul``'s kernel gradient from ``x`` and the output's cotangent ``g``."""
    return _call("matmul_weight_grad", (x.shape[1], g.shape[1]), x, g.astype(x.dtype))
