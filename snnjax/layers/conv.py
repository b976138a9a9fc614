"""Convolution and linear layers over time-major, channels-last tensors.

Flax's ``Conv`` and ``Linear`` already treat every leading axis as batch, so
``[T, N, H, W, C]`` runs as one merged ``[T*N]`` batch (SpikingJelly's
``SeqToANNContainer``) without an explicit reshape.

Under a parallel plan that splits the batch (or the time steps) over devices,
``Conv2d`` merges the two so that each device's examples stay its own: ``T`` and
``N`` are each cut at their shard boundaries, the shard indices moved outermost
(``N``'s, then ``T``'s) and the rest merged, a local rearrangement. A plain
``T*N`` merge with a split axis minor cannot stay split, so XLA would gather the
activations over that axis (and every device would then convolve them all).
The result is the same (each example is convolved on its own).

``Linear`` merges the leading axes itself (``[T, N, F]`` -> ``[T*N, F]``) when no activation axis is split: the
weight gradient is then one matmul over the merged rows, where over ``(T, N)`` as two contracted axes XLA:CPU
first copies the output gradient into a transposed layout (a pass over ``[T, N, out]`` in every step).

On the CPU backend ``Conv2d`` convolves with ``conv_cpu.conv2d_nhwc``, whose
backward avoids XLA:CPU's slow convolution gradients (catastrophic inside
``lax.scan``) and whose forward and weight gradient skip the zeros of a spike input (``sparse_conv``); on other
backends it is ``lax.conv_general_dilated`` as in ``nnx.Conv``.
``Linear`` and ``linear_general``'s layers multiply with ``linear_cpu.dot_general``: on the CPU backend the
sparse-input matmul for spikes, elsewhere ``lax.dot_general``.

Within ``observe_inputs(fn)`` every call of a ``Conv2d`` or ``Linear`` (what ``conv2d`` / ``linear`` build) also
hands ``(layer, inputs)`` to ``fn``, as neurons hand their spikes to ``snnjax.neurons.modules.observe``:
``snnjax.learning`` reads a synapse's input spikes this way.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax.layers import conv_cpu, linear_cpu
from snnjax.parallel.logical import ACTIVATION_AXES, annotate, annotate_layer, shards

Axes = Sequence[str | None] | None
_INPUT_OBSERVER: contextvars.ContextVar = contextvars.ContextVar("snnjax_layer_input_observer", default=None)


@contextlib.contextmanager
def observe_inputs(fn: Callable[[nnx.Module, jax.Array], None]):
    """Within this context every ``Conv2d`` / ``Linear`` call also calls ``fn(layer, inputs)`` (before the layer
    runs; ``inputs`` as the layer gets them, e.g. ``[T, N, H, W, C]``). Contexts nest: an enclosing one's ``fn`` is
    called too."""
    outer = _INPUT_OBSERVER.get()
    token = _INPUT_OBSERVER.set(fn if outer is None else lambda *seen: (outer(*seen), fn(*seen)))
    try:
        yield
    finally:
        _INPUT_OBSERVER.reset(token)


def _report_input(layer: nnx.Module, inputs: jax.Array) -> None:
    observer = _INPUT_OBSERVER.get()
    if observer is not None:
        observer(layer, inputs)


class Linear(nnx.Linear):
    """``nnx.Linear`` whose calls ``observe_inputs`` sees; ``[..., in] -> [..., out]`` as one ``[rows, in]`` matmul
    where no device split stands in the way (``_merges_leading_dims``).

    ``dot_general`` defaults to ``linear_cpu.dot_general`` (the sparse-input matmul for spikes on the CPU backend).
    """

    def __init__(self, *args, dot_general=linear_cpu.dot_general, **kwargs):
        super().__init__(*args, dot_general=dot_general, **kwargs)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        _report_input(self, inputs)
        if not _merges_leading_dims(inputs):
            return self._project(inputs)
        y = self._project(inputs.reshape(-1, inputs.shape[-1]))
        return y.reshape(*inputs.shape[:-1], y.shape[-1])

    def _project(self, inputs: jax.Array) -> jax.Array:
        return nnx.Linear.__call__(self, inputs)


def _merges_leading_dims(inputs: jax.Array) -> bool:
    """Whether ``Linear`` merges the leading dims of ``inputs`` into one before its matmul: they are more than one
    and the active layout splits no activation axis (a merge with a split axis minor would gather it)."""
    return inputs.ndim > 2 and all(shards(name) == 1 for name in ACTIVATION_AXES)


class Conv2d(nnx.Conv):
    """``nnx.Conv`` on ``[T, N, H, W, C]`` that keeps a device-split batch axis split (see the module docstring).

    ``conv_general_dilated`` defaults to ``conv_cpu.conv_general_dilated`` (the CPU op on the CPU backend).
    """

    def __init__(self, *args, conv_general_dilated=conv_cpu.conv_general_dilated, **kwargs):
        super().__init__(*args, conv_general_dilated=conv_general_dilated, **kwargs)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        _report_input(self, inputs)
        pt, pn = shards("time"), shards("batch")
        if inputs.ndim != 5 or pt * pn == 1:
            return self._convolve(inputs)
        t, n, *rest = inputs.shape
        pt, pn = (pt, pn) if t % pt == 0 and n % pn == 0 else (1, 1)
        # [T, N] -> [pt, T/pt, pn, N/pn] -> [pn, pt, N/pn, T/pt] -> [N*T]: each device's block contiguous
        x = inputs.reshape(pt, t // pt, pn, n // pn, *rest).transpose(2, 0, 3, 1, 4, 5, 6)
        y = self._convolve(x.reshape(n * t, *rest))
        y = y.reshape(pn, pt, n // pn, t // pt, *y.shape[1:]).transpose(1, 3, 0, 2, 4, 5, 6)
        return y.reshape(t, n, *y.shape[4:])

    def _convolve(self, x: jax.Array) -> jax.Array:
        return nnx.Conv.__call__(self, x)


def standardize(w: jax.Array, gain: jax.Array | None, eps: float, out_axis: int = -1) -> jax.Array:
    """Weight standardisation (SpikingJelly's ``WSConv2d`` / ``WSLinear``): per output unit, ``(w - mean) /
    sqrt(var * fan_in + eps)`` over the other axes (``var`` unbiased, as torch's), times ``gain`` ``[out]``."""
    axes = tuple(a for a in range(w.ndim) if a != out_axis % w.ndim)
    fan_in = 1
    for a in axes:
        fan_in *= w.shape[a]
    mean = jnp.mean(w, axis=axes, keepdims=True)
    var = jnp.var(w, axis=axes, keepdims=True, ddof=1)
    w = (w - mean) / (var * fan_in + eps) ** 0.5
    return w if gain is None else w * gain


class _WeightStandardized:
    """What ``WSConv2d`` and ``WSLinear`` share: a learned ``gain`` ``[out]`` (ones at first; ``gain=False``: none)
    and ``eps``; ``standardized_kernel()`` is the kernel the layer computes with (its own shape)."""

    def __init__(self, *args, gain: bool = True, eps: float = 1e-4, **kwargs):
        super().__init__(*args, **kwargs)
        self.gain = nnx.Param(jnp.ones((self.out_features,), self.param_dtype)) if gain else None
        self.eps = eps

    def standardized_kernel(self) -> jax.Array:
        return standardize(self.kernel[...], None if self.gain is None else self.gain[...], self.eps)


class WSConv2d(_WeightStandardized, Conv2d):
    """``Conv2d`` whose kernel is weight-standardised per output channel before use, times a learned ``gain``
    ``[O]`` (ones at first; ``gain=False``: none), ``eps`` 1e-4 (SpikingJelly's ``layer.WSConv2d``)."""

    def _convolve(self, x: jax.Array) -> jax.Array:
        lead = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:])
        w = self.standardized_kernel()
        dtype = self.dtype or jnp.result_type(x, w)
        strides = (self.strides,) * 2 if isinstance(self.strides, int) else tuple(self.strides)
        y = self.conv_general_dilated(x.astype(dtype), w.astype(dtype), strides, self.padding,
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))
        if self.bias is not None:
            y = y + self.bias[...].astype(dtype)
        return y.reshape(*lead, *y.shape[1:])


class WSLinear(_WeightStandardized, Linear):
    """``Linear`` (kernel ``[in, out]``) weight-standardised per output unit, times a learned ``gain`` ``[out]``
    (SpikingJelly's ``layer.WSLinear``)."""

    def _project(self, x: jax.Array) -> jax.Array:
        w = self.standardized_kernel()
        dtype = self.dtype or jnp.result_type(x, w)
        y = self.dot_general(x.astype(dtype), w.astype(dtype), (((x.ndim - 1,), (0,)), ((), ())),
                             precision=self.precision)
        return y if self.bias is None else y + self.bias[...].astype(dtype)


class Scale(nnx.Module):
    """``x * scale`` (SpikingJelly's OTTT VGG rescales spikes by 2.74 after weight-standardised layers)."""

    def __init__(self, scale: float):
        self.scale = float(scale)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * self.scale


def conv2d(in_channels: int, out_channels: int, kernel_size: int, *, stride: int = 1, padding: int = 0,
           use_bias: bool = True, kernel_init=None, rngs: nnx.Rngs, dtype=None, param_dtype=None,
           axes: Axes = None, weight_standardization: bool = False) -> Conv2d:
    """A torch-style ``Conv2d`` (integer symmetric padding) on ``[..., H, W, C]``; kernel ``[kh, kw, I, O]``.

    ``axes``: logical names ``(in, out)`` of the channel dims (the window dims are ``window``; a
    ``WSConv2d``'s gain takes ``out``). ``weight_standardization``: a ``WSConv2d``.
    """
    kwargs = {}
    if kernel_init is not None:
        kwargs["kernel_init"] = kernel_init
    if param_dtype is not None:
        kwargs["param_dtype"] = param_dtype
    conv = (WSConv2d if weight_standardization else Conv2d)(
        in_channels, out_channels, (kernel_size, kernel_size), strides=stride,
        padding=((padding, padding), (padding, padding)), use_bias=use_bias, dtype=dtype, rngs=rngs, **kwargs)
    return _annotate(conv, ("window", "window", *axes)) if axes is not None else conv


def _annotate(layer: nnx.Module, kernel: Sequence[str | None]) -> nnx.Module:
    annotate_layer(layer, kernel)
    if getattr(layer, "gain", None) is not None:
        annotate(layer.gain, kernel[-1])
    return layer


def linear(in_features: int, out_features: int, *, use_bias: bool = True, kernel_init=None,
           rngs: nnx.Rngs, dtype=None, param_dtype=None, axes: Axes = None,
           weight_standardization: bool = False) -> Linear:
    """``[..., in] -> [..., out]``; kernel ``[in, out]`` (a torch ``Conv1d(k=1)`` on tokens is this too).

    ``axes``: logical names ``(in, out)`` of the kernel (the bias and a ``WSLinear``'s gain take ``out``).
    ``weight_standardization``: a ``WSLinear``.
    """
    kwargs = {}
    if kernel_init is not None:
        kwargs["kernel_init"] = kernel_init
    if param_dtype is not None:
        kwargs["param_dtype"] = param_dtype
    layer = (WSLinear if weight_standardization else Linear)(in_features, out_features, use_bias=use_bias,
                                                             dtype=dtype, rngs=rngs, **kwargs)
    return _annotate(layer, axes) if axes is not None else layer


def linear_general(in_features: int | tuple[int, ...], out_features: int | tuple[int, ...], *,
                   use_bias: bool = True, kernel_init=None, rngs: nnx.Rngs, dtype=None, param_dtype=None,
                   axes: Axes = None) -> nnx.LinearGeneral:
    """A linear map over the trailing ``in_features`` dims to ``out_features`` dims; kernel ``[*in, *out]``.

    E.g. a fused q/k/v projection ``D -> (3, heads, head_dim)`` whose kernel can be split by whole heads.
    ``axes``: one logical name per kernel dim (the bias takes the output dims' names).
    """
    in_features = (in_features,) if isinstance(in_features, int) else tuple(in_features)
    kwargs = {}
    if kernel_init is not None:
        kwargs["kernel_init"] = kernel_init
    if param_dtype is not None:
        kwargs["param_dtype"] = param_dtype
    layer = nnx.LinearGeneral(in_features, out_features, axis=tuple(range(-len(in_features), 0)),
                              use_bias=use_bias, dtype=dtype, rngs=rngs, dot_general=linear_cpu.dot_general, **kwargs)
    return annotate_layer(layer, axes) if axes is not None else layer


class Flatten(nnx.Module):
    """``[T, N, H, W, C] -> [T, N, C*H*W]`` in torch's order (channels outermost), as SpikingJelly's
    ``layer.Flatten`` after a convolution: a torch ``Linear`` that follows it imports with a plain transpose.
    ``order="hwc"`` flattens in memory order instead (``flatten_features``, no transpose). ``[T, N, F]`` passes
    through unchanged; ``[T, N, L, D]`` flattens ``L*D``.
    """

    def __init__(self, order: str = "chw"):
        if order not in ("chw", "hwc"):
            raise ValueError(f"Flatten(order=...) must be 'chw' (torch's order) or 'hwc', got {order!r}")
        self.order = order

    def __call__(self, x: jax.Array) -> jax.Array:
        return flatten_features(x, 2, self.order)


def flatten_features(x: jax.Array, lead: int = 2, order: str = "hwc") -> jax.Array:
    """Flatten everything after the first ``lead`` axes: ``[T, N, H, W, C] -> [T, N, H*W*C]`` (HWC order;
    ``order="chw"``: an image ``[*lead, H, W, C]`` flattens channels outermost, as torch's ``C*H*W``)."""
    if order == "chw" and x.ndim == lead + 3:
        x = jnp.moveaxis(x, -1, lead)
    return x.reshape(x.shape[:lead] + (-1,))
