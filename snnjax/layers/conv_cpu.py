"""A 2-D convolution whose backward is written for XLA:CPU (a ``jax.custom_vjp``).

Why: XLA:CPU differentiates a convolution into convolutions with the batch as
the contracted dimension, which it runs catastrophically slowly inside any loop
body (``lax.scan``, ``fori_loop``: seconds to minutes; jax-ml/jax issue 12868).
Gradient accumulation and the pipeline executor run model code inside loops, so
the CPU path uses this op instead, whose gradients are plain forward
convolutions (batch ``b``, spatial ``01``, features ``f``; kernel ``01io``):

- input gradient: the cotangent convolved with the spatially flipped,
  in/out-transposed kernel (strides become ``lhs_dilation``);
- weight gradient: a forward convolution over the batch: ``x`` as ``[C_in, H, W,
  N]`` (C_in the batch, N the contracted feature) with the cotangent as the
  kernel ``[H_out, W_out, N, C_out]`` (dilated by the strides), giving
  ``[C_in, kh, kw, C_out]``. Bit-identical to XLA's own weight gradient, equally
  fast outside loops and as fast inside them; on Eigen (``compiler_options``) it
  runs at matmul speed without materialising patches (2x faster than an im2col
  matmul, whose patches cost as much as the matmul);
- forward with an output smaller than the kernel (a 2 x 2 image, 3 x 3 kernel):
  im2col and one matmul, 13x faster than XLA's conv there; the input gradient
  with an input or output smaller than the kernel: the cotangent times the kernel
  and the transposed windows (``col2im_input_grad``), where XLA:CPU's conv made
  the backward 4-13x slower (ResNet-18's stride-2 convs into its 2 x 2 and 1 x 1 stages);
- a ``1 x 1`` output: a sum over the kernel taps that reach the input (``tap_conv``),
  forward and both gradients (its transposes): no products with padding;
- an input of spikes (at most ``sparse_conv.MAX_DENSITY`` nonzero, decided per call with a ``lax.cond``): the
  forward and the weight gradient on ``sparse_conv``'s kernels, whose work scales with the nonzeros
  (CIFAR10DVSVGG's train step 1.3-1.4x faster, SEW-ResNet-18's 1.15x); on one device only (``sparse_refusal``;
  ``print(plan)`` says which convolutions take it).

Steps that convolve on the CPU compile with ``compiler_options((state, dtype), platform)`` (the library's own
steps do; pass it as ``jax.jit(..., compiler_options=...)`` when you jit model code yourself: ``import snnjax``
sets nothing process-wide). It is chosen per compile, from the step's dtypes, because XLA:CPU (jax 0.10) has two
convolution runtimes and each dtype has its own faster one (2-core CPU, CPU milliseconds of the process, which a
shared machine's load disturbs less than wall time):

- float32: YNNPACK by default; Eigen is as fast for the forward and the input gradient and 2x faster for the
  weight gradient (CIFAR10DVSVGG's eight layers at N*T = 32: forward 1069 vs 1046 ms, input gradient 1105 vs
  1075 ms, weight gradient 2358 vs 1168 ms, YNNPACK vs Eigen), so float32 steps compile with YNNPACK's
  convolutions off (``CPU_CONV_OPTIONS``);
- float64: YNNPACK by default; Eigen has no float64 convolution (XLA falls back to a plain loop: a 3x3 conv
  ``[60, 48, 48, 64] -> 128`` takes 5.3 s against 0.4 s), so float64 steps keep XLA's default;
- bfloat16 / float16: XLA:CPU converts their convolutions (forward and both gradients) to float32, which YNNPACK
  then takes by default: they compile as float32 does.

The whole CIFAR10DVSVGG train step (``python -m snnjax.bench.plain_jit``, load average 10-17): float32, N = 8, T = 4:
24.5 s with XLA's default against 15.2 s with these options (CPU time 5.3 / 3.8 s); float64, N = 2, T = 2, 16 x 16:
0.66 s with XLA's default (what it now gets) against 9.8 s with the Eigen option (what ``import snnjax`` used to
set for every compile; CPU time 0.30 / 5.0 s).

oneDNN (3.2, through an XLA FFI call: ``python -m snnjax.bench.conv``, records in ``benchmarks/results/conv_cpu.jsonl``)
is no faster at the zoo's shapes: CIFAR10DVSVGG's convolutions at N*T = 32 take 2795 CPU ms against Eigen's 3012
(forward and input gradient 10-20% faster on the large layers, kernel gradient slower on the 12 x 12 and 6 x 6 ones),
both near the cores' peak; the ResNets' convolutions (maps of 16 x 16 and smaller) take 1.2-1.7x this op's CPU
time on oneDNN, so this op stays on XLA.

No form of the convolution gets Eigen under XLA's default options (so plain ``jax.jit`` without the options pays
YNNPACK's weight gradient): YNNPACK does not take a 3-D convolution with a unit depth, but Eigen's 3-D path is
as slow as YNNPACK for the weight gradient (2300 ms above), and a cotangent-as-kernel taller than the input,
which YNNPACK does not take either, leaves Eigen too (XLA's plain loop, about 20x).

Shapes: ``x [N, H, W, C_in]``, kernel ``[kh, kw, C_in, C_out]`` (NHWC / HWIO, as
``nnx.Conv``), output ``[N, H_out, W_out, C_out]``; any strides and explicit or
string padding. Dilation and feature groups fall back to ``lax.conv_general_dilated``.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from snnjax.layers import sparse_conv
from snnjax.parallel import conv_paths, logical

_DN = ("NHWC", "HWIO", "NHWC")
Padding = str | Sequence[tuple[int, int]]

# The YNNPACK fusion kinds XLA:CPU enables by default (jax 0.10), less its convolutions.
CPU_CONV_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type":
                    "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"}


def compiler_options(arrays, platform: str | None = None) -> dict[str, str] | None:
    """``jax.jit(..., compiler_options=...)`` for a step over ``arrays`` compiled for ``platform`` (default: JAX's).

    ``arrays``: a pytree of what sets the step's dtypes: arrays, ``jax.ShapeDtypeStruct`` or dtypes (e.g.
    ``(state, cfg.compute_dtype)``). Returns ``CPU_CONV_OPTIONS`` (convolutions on XLA's Eigen runtime) on the
    CPU when none of them is float64; otherwise ``None``, XLA's default (the module docstring has the measurements).
    """
    if (platform or jax.default_backend()) != "cpu" or any(map(_is_float64, jax.tree.leaves(arrays))):
        return None
    return dict(CPU_CONV_OPTIONS)


def _is_float64(leaf) -> bool:
    """Whether ``leaf`` (an array, a ``ShapeDtypeStruct`` or a dtype) is float64; False for anything else."""
    try:
        return jnp.dtype(getattr(leaf, "dtype", leaf)) == jnp.float64
    except TypeError:
        return False


def _forward(x, w, strides, padding, precision, out_dtype):
    if _single_output(x.shape, w.shape, strides, padding):
        return tap_conv(x, w, strides, padding, precision).astype(out_dtype or x.dtype)
    if _tiny_output(x.shape, w.shape, strides, padding):
        return im2col_conv(x, w, strides, padding, precision).astype(out_dtype or x.dtype)
    return lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=_DN, precision=precision,
                                    preferred_element_type=out_dtype)


def _out_hw(x_shape, w_shape, strides, padding) -> tuple[int, int]:
    """The output's ``(H_out, W_out)``."""
    return tuple((size + lo + hi - k) // s + 1 for size, k, s, (lo, hi) in
                 zip(x_shape[1:3], w_shape[:2], strides, padding, strict=True))


def _single_output(x_shape, w_shape, strides, padding) -> bool:
    """Whether the output is ``1 x 1`` (``tap_conv`` and its transposes: forward and both gradients)."""
    return max(_out_hw(x_shape, w_shape, strides, padding)) == 1


def _tiny_output(x_shape, w_shape, strides, padding) -> bool:
    """Whether the output is smaller than the kernel (e.g. 2 x 2 from 3 x 3), where XLA:CPU's conv is ~13x slow."""
    return min(_out_hw(x_shape, w_shape, strides, padding)) < min(w_shape[:2])


def _tiny_input(x_shape, w_shape) -> bool:
    """Whether the input is smaller than the kernel (a ResNet's ``2 x 2`` last stage under a ``3 x 3`` kernel)."""
    return min(x_shape[1:3]) < min(w_shape[:2])


def _windows(x, kh, kw, out_hw, strides, padding):
    """The ``kh * kw`` shifted, strided windows of the padded ``x``, stacked: ``[N, H_out, W_out, kh * kw, C]``."""
    (ho, wo), (sh, sw) = out_hw, strides
    xp = lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), (*padding[0], 0), (*padding[1], 0), (0, 0, 0)))
    n, c = x.shape[0], x.shape[3]
    return jnp.stack([lax.slice(xp, (0, i, j, 0), (n, i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1, c), (1, sh, sw, 1))
                      for i in range(kh) for j in range(kw)], axis=3)


def im2col_conv(x: jax.Array, w: jax.Array, strides: tuple[int, int], padding: Sequence[tuple[int, int]],
                precision=None) -> jax.Array:
    """The convolution as patches ``[N, H_out, W_out, kh * kw, C_in]`` times ``w [kh * kw, C_in, C_out]``.

    Used where the output is smaller than the kernel (Spikformer's 2 x 2 positional-encoding conv: 1.2 ms
    against XLA's 16 ms); elsewhere XLA's convolution is as fast or faster. Float32 or wider result.
    """
    kh, kw, ci, co = w.shape
    acc = _acc_dtype(x.dtype)
    patches = _windows(x, kh, kw, _out_hw(x.shape, w.shape, strides, padding), strides, padding).astype(acc)
    return lax.dot_general(patches, w.reshape(kh * kw, ci, co).astype(acc), (((3, 4), (0, 1)), ((), ())),
                           precision=precision)


def _tap_range(size: int, out: int, k: int, stride: int, lo: int) -> tuple[int, int, int]:
    """``(o0, o1, i0)``: the outputs ``o0 <= o < o1`` whose window's tap ``k`` lands inside the input (at rows
    ``i0, i0 + stride, ...``) along one spatial axis; ``lo`` is that axis's leading padding."""
    o0 = max(0, -(-(lo - k) // stride))
    o1 = min(out, (size - 1 + lo - k) // stride + 1)
    return o0, o1, o0 * stride + k - lo


def tap_conv(x: jax.Array, w: jax.Array, strides: tuple[int, int], padding: Sequence[tuple[int, int]],
             precision=None) -> jax.Array:
    """The convolution as a sum over the kernel's taps: for tap ``(i, j)``, the strided slice of ``x`` it reaches
    times ``w[i, j] [C_in, C_out]``, placed at the outputs it serves. Products with padding are never formed.

    For convolutions with a ``1 x 1`` output (a CIFAR-sized ResNet's last stage: of a 3 x 3 kernel over a
    ``1 x 1`` input only the centre tap is not padding, 1/9 of an im2col's products). Linear in ``x`` and in
    ``w``, so its transposes (``jax.linear_transpose``) are the gradients. Float32 or wider result.
    """
    kh, kw, ci, co = w.shape
    n, h, wd = x.shape[:3]
    (ho, wo), acc = _out_hw(x.shape, w.shape, strides, padding), _acc_dtype(x.dtype)
    out = jnp.zeros((n, ho, wo, co), acc)
    for i in range(kh):
        a0, a1, r0 = _tap_range(h, ho, i, strides[0], padding[0][0])
        for j in range(kw):
            b0, b1, c0 = _tap_range(wd, wo, j, strides[1], padding[1][0])
            if a1 <= a0 or b1 <= b0:
                continue  # this tap reads padding only
            xs = lax.slice(x, (0, r0, c0, 0), (n, r0 + (a1 - a0 - 1) * strides[0] + 1,
                                               c0 + (b1 - b0 - 1) * strides[1] + 1, ci), (1, *strides, 1))
            part = lax.dot_general(xs.astype(acc), w[i, j].astype(acc), (((3,), (0,)), ((), ())), precision=precision)
            out = out + lax.pad(part, jnp.zeros((), acc), ((0, 0, 0), (a0, ho - a1, 0), (b0, wo - b1, 0), (0, 0, 0)))
    return out


def _transpose(linear, in_shape: Sequence[int], g: jax.Array) -> jax.Array:
    """``linear``'s transpose applied to ``g``: the gradient of a ``tap_conv`` for an input of ``in_shape``."""
    return jax.linear_transpose(linear, jax.ShapeDtypeStruct(tuple(in_shape), g.dtype))(g)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def conv2d_nhwc(x: jax.Array, w: jax.Array, strides: tuple[int, int], padding: tuple[tuple[int, int], ...],
                precision=None, out_dtype=None, sparse: bool = False) -> jax.Array:
    """``x [N, H, W, C_in]`` * ``w [kh, kw, C_in, C_out]`` -> ``[N, H_out, W_out, C_out]`` (explicit padding pairs).

    ``sparse``: where at most ``sparse_conv.MAX_DENSITY`` of ``x`` is nonzero (decided per call), the forward and
    the kernel gradient run ``sparse_conv``'s kernels (``sparse_refusal`` says where they may be asked for).
    """
    return _sparse_or_dense(x, w, strides, padding, precision, out_dtype, sparse)[0]


def _sparse_or_dense(x, w, strides, padding, precision, out_dtype, sparse):
    """``(y, takes_sparse)``: ``takes_sparse`` a traced bool, or None where ``sparse`` is off."""
    if not sparse:
        return _forward(x, w, strides, padding, precision, out_dtype), None
    takes = takes_sparse(x)
    out_hw = _out_hw(x.shape, w.shape, strides, padding)
    y = lax.cond(takes, lambda x, w: sparse_conv.forward(x, w, out_hw, strides, padding),
                 lambda x, w: _forward(x, w, strides, padding, precision, out_dtype), x, w)
    return y, takes


def takes_sparse(x: jax.Array) -> jax.Array:
    """Whether the sparse kernels take an op on ``x``: at most ``sparse_conv.MAX_DENSITY`` of it nonzero (traced)."""
    return jnp.mean(x != 0, dtype=jnp.float32) <= sparse_conv.MAX_DENSITY


def _fwd(x, w, strides, padding, precision, out_dtype, sparse):
    y, takes = _sparse_or_dense(x, w, strides, padding, precision, out_dtype, sparse)
    return y, (x, w, takes)


def _bwd(strides, padding, precision, out_dtype, sparse, res, g):
    x, w, takes = res
    dx = input_grad(g, w, x.shape, strides, padding, precision).astype(x.dtype)
    dense = functools.partial(weight_grad, w_shape=w.shape, strides=strides, padding=padding, precision=precision)
    if takes is None:
        return dx, dense(x, g).astype(w.dtype)
    dw = lax.cond(takes, lambda x, g: sparse_conv.weight_grad(x, g, w.shape, strides, padding),
                  lambda x, g: dense(x, g).astype(w.dtype), x, g)
    return dx, dw


conv2d_nhwc.defvjp(_fwd, _bwd)

_SPARSE_INPUTS: contextvars.ContextVar[bool] = contextvars.ContextVar("snnjax_sparse_inputs", default=True)


@contextlib.contextmanager
def sparse_inputs(enabled: bool):
    """Within this context the CPU convolutions traced may (True, the default) or may not (False) take
    ``sparse_conv``'s kernels: off where the program must hold no custom call (``jax.export``: the FFI kernels
    would tie the file to this build) or where a transformation reads its convolutions (the pipeline's weight
    split)."""
    token = _SPARSE_INPUTS.set(bool(enabled))
    try:
        yield
    finally:
        _SPARSE_INPUTS.reset(token)


SPARSE_PATH = (f"sparse-input kernels where at most {sparse_conv.MAX_DENSITY:.0%} of the input is nonzero "
               "(decided per call), else XLA's")


def sparse_refusal(x_shape: Sequence[int], w_shape: Sequence[int], x_dtype, w_dtype, out_dtype,
                   strides: tuple[int, int], padding: Sequence[tuple[int, int]]) -> str | None:
    """None where ``conv2d_nhwc(..., sparse=True)`` may take ``sparse_conv``'s kernels for this convolution on the
    traced device count; else why not (what ``print(plan)`` says)."""
    if not _SPARSE_INPUTS.get():
        return "the sparse kernels are turned off here (conv_cpu.sparse_inputs(False))"
    if (devices := _devices()) > 1:
        return (f"the layout spans {devices} devices and the sparse kernels' FFI call has no partitioning rule "
                "(XLA would gather its operands)")
    if not sparse_conv.supports(x_dtype, w_dtype, w_shape[2], w_shape[3]) or out_dtype not in (None, x_dtype):
        return (f"the sparse kernels take float32 / float64, at least {sparse_conv.MIN_IN_CHANNELS} input channels "
                f"and output channels a multiple of 8, not {jnp.dtype(x_dtype).name} with {w_shape[2]} -> "
                f"{w_shape[3]}")
    if _tiny_output(x_shape, w_shape, strides, padding):
        return "the output is smaller than the kernel (an im2col matmul or a sum over taps)"
    if not sparse_conv.available():
        return "the sparse kernels could not be built (the log says why)"
    return None


def _devices() -> int:
    """How many devices the convolution being traced spans: the largest of the active layout's (``logical``'s
    rules), the abstract mesh's and a plan's (``conv_paths.planned_devices``)."""
    return max(logical.active_devices(), jax.sharding.get_abstract_mesh().size, conv_paths.planned())


def input_grad(g: jax.Array, w: jax.Array, x_shape: Sequence[int], strides: tuple[int, int],
               padding: Sequence[tuple[int, int]], precision=None) -> jax.Array:
    """``dL/dx [N, H, W, C_in]`` from the cotangent ``g [N, H_out, W_out, C_out]``: a conv with the flipped kernel.

    Returned in ``g``'s dtype, or float32 for lower-precision ``g``.
    """
    acc = _acc_dtype(g.dtype)
    if _single_output(x_shape, w.shape, strides, padding):
        return _transpose(functools.partial(tap_conv, w=w, strides=strides, padding=padding, precision=precision),
                          x_shape, g.astype(acc))
    if _tiny_output(x_shape, w.shape, strides, padding) or _tiny_input(x_shape, w.shape):
        return col2im_input_grad(g, w, x_shape, strides, padding, precision)
    pads = []
    for k, s, (lo, hi), size, out in zip(w.shape[:2], strides, padding, x_shape[1:3], g.shape[1:3],
                                         strict=True):
        pads.append((k - 1 - lo, k - 1 - hi + _unreached(size, lo, hi, out, s, k)))
    w_t = jnp.flip(w, (0, 1)).swapaxes(2, 3).astype(g.dtype)
    return lax.conv_general_dilated(g, w_t, (1, 1), pads, lhs_dilation=strides, dimension_numbers=_DN,
                                   precision=precision, preferred_element_type=acc)


def col2im_input_grad(g: jax.Array, w: jax.Array, x_shape: Sequence[int], strides: tuple[int, int],
                      padding: Sequence[tuple[int, int]], precision=None) -> jax.Array:
    """``dL/dx`` of ``im2col_conv``: the cotangent times the kernel (contracting ``C_out``), each tap's slice added
    back at its strided window (the transpose of the windows).

    For convolutions whose input or output is smaller than the kernel (a ResNet's last stage): there XLA:CPU swaps
    the operands of the input-gradient convolution into a layout its Eigen runtime does not take and runs it on a
    generic loop (SEW-ResNet-18's ``4 x 4 -> 2 x 2`` stride-2 conv, 256 -> 512 channels at N*T = 32, 2-core CPU:
    its backward, both gradients, 69 ms there, 5.1 ms here).
    """
    kh, kw, ci, co = w.shape
    acc = _acc_dtype(g.dtype)
    patch_grad = lax.dot_general(g.astype(acc), w.reshape(kh * kw, ci, co).astype(acc), (((3,), (2,)), ((), ())),
                                 precision=precision)  # [N, H_out, W_out, kh * kw, C_in]
    windows = functools.partial(_windows, kh=kh, kw=kw, out_hw=g.shape[1:3], strides=strides, padding=padding)
    (dx,) = jax.linear_transpose(windows, jax.ShapeDtypeStruct(tuple(x_shape), acc))(patch_grad)
    return dx


def weight_grad(x: jax.Array, g: jax.Array, w_shape: Sequence[int], strides: tuple[int, int],
                padding: Sequence[tuple[int, int]], precision=None) -> jax.Array:
    """``dL/dw [kh, kw, C_in, C_out]``: a forward convolution over the batch (see the module docstring).

    Returned in ``x``'s dtype, or float32 for lower-precision ``x``.
    """
    acc = _acc_dtype(x.dtype)
    if _single_output(x.shape, w_shape, strides, padding):
        return _transpose(functools.partial(tap_conv, x, strides=strides, padding=padding, precision=precision),
                          w_shape, g.astype(acc))
    kh, kw = w_shape[:2]
    pads = []
    for k, s, (lo, hi), size, out in zip((kh, kw), strides, padding, x.shape[1:3], g.shape[1:3], strict=True):
        pads.append((lo, hi - _unreached(size, lo, hi, out, s, k)))
    # lhs [C_in, H, W, N] (C_in as the batch, N as the contracted feature), rhs [H_out, W_out, N, C_out]
    # (the cotangent as a kernel, dilated by the strides) -> [C_in, kh, kw, C_out].
    dw = lax.conv_general_dilated(x.transpose(3, 1, 2, 0).astype(acc), g.transpose(1, 2, 0, 3).astype(acc), (1, 1),
                                  pads, rhs_dilation=strides, dimension_numbers=_DN, precision=precision)
    return dw.transpose(1, 2, 0, 3)


def _unreached(size: int, lo: int, hi: int, out: int, stride: int, k: int) -> int:
    """How many trailing rows of the padded input no window reached (a stride that does not divide evenly)."""
    return size + lo + hi - ((out - 1) * stride + k)


def _acc_dtype(dtype):
    """Accumulate low-precision floats in float32 (as XLA's CPU convolution does); others in their own dtype."""
    return jnp.float32 if jnp.finfo(dtype).bits < 32 else dtype


def conv_general_dilated(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding: Padding,
                         lhs_dilation=None, rhs_dilation=None, dimension_numbers=None, feature_group_count: int = 1,
                         batch_group_count: int = 1, precision=None, preferred_element_type=None,
                         out_sharding=None) -> jax.Array:
    """Drop-in ``lax.conv_general_dilated`` (``nnx.Conv``'s hook): ``conv2d_nhwc`` on the CPU backend, else XLA's.

    The CPU op is used (decided at trace time) for 2-D NHWC/HWIO convolutions without dilation or groups;
    everything else, and every other backend, calls ``lax.conv_general_dilated`` unchanged.
    """
    ones = (1, 1)
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    ours = (jax.default_backend() == "cpu" and lhs.ndim == 4 and dn == lax.conv_dimension_numbers(
        lhs.shape, rhs.shape, _DN) and tuple(lhs_dilation or ones) == ones and tuple(rhs_dilation or ones) == ones
            and feature_group_count == 1 and batch_group_count == 1 and out_sharding is None)
    if not ours:
        return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                        dimension_numbers, feature_group_count, batch_group_count, precision,
                                        preferred_element_type, out_sharding=out_sharding)
    if isinstance(padding, str):
        padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
    strides, padding = tuple(window_strides), tuple(tuple(p) for p in padding)
    refusal = sparse_refusal(lhs.shape, rhs.shape, lhs.dtype, rhs.dtype, preferred_element_type, strides, padding)
    conv_paths.record(lhs.shape, rhs.shape, "xla" if refusal else "sparse", refusal or SPARSE_PATH)
    return conv2d_nhwc(lhs, rhs, strides, padding, precision, preferred_element_type, refusal is None)
