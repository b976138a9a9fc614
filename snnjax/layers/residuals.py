"""Compressed residuals for spike inputs: what a layer after a neuron keeps for its backward.

A convolution or linear layer keeps its input for the weight gradient. After a neuron that
input is spikes (0/1), or a small integer (Spikformer's residual stream: a sum of spikes), or
a multiple of 1/4 (spikes average-pooled 2 x 2). ``compressed_apply`` runs such a layer and
keeps the input encoded exactly (:class:`Codec`):

- ``float``: as it is (no saving; the residual is still named, for the ``spikes`` remat policy);
- ``int8``: one byte per value, ``round(x * scale)`` (4x less than float32, 8x less than float64);
- ``bits``: one bit per value, packed 8 to a byte along the last axis (32x less than float32);
  only for binary tensors.

Decoding gives back the same values bit for bit, so gradients do not change. The forward
computes its output from the decoded input too, so a recomputation (``jax.checkpoint``) needs
only the encoded tensor. Every encoded residual is named ``"spikes"`` (``checkpoint_name``):
the ``spikes`` remat policy saves exactly these and recomputes the rest.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from snnjax.parallel.param_stream import on_host

STORAGE = ("float", "int8", "bits")
SPIKES = "spikes"  # the checkpoint name of every encoded residual


@dataclasses.dataclass(frozen=True)
class Codec:
    """How a spike-valued tensor is stored: ``kind`` in ``STORAGE``; values are multiples of ``1 / scale``."""

    kind: str = "float"
    scale: float = 1.0

    def __post_init__(self):
        if self.kind not in STORAGE:
            raise ValueError(f"spike storage must be one of {STORAGE}, got {self.kind!r}")
        if self.kind == "bits" and self.scale != 1.0:
            raise ValueError("bits store binary tensors only (scale 1)")


def codec_for(storage: str, values: str) -> Codec:
    """The codec for ``storage`` and tensors whose ``values`` are ``binary``, ``counts`` (small integers) or
    ``quarters`` (multiples of 1/4): ``bits`` falls back to ``int8`` for non-binary values."""
    scale = {"binary": 1.0, "counts": 1.0, "quarters": 4.0}[values]
    if storage == "bits" and values != "binary":
        storage = "int8"
    return Codec(storage, scale)


def encode(codec: Codec, x: jax.Array) -> jax.Array:
    """``x [..., C]`` as stored: itself, int8 ``[..., C]``, or uint8 ``[..., ceil(C / 8)]`` bits."""
    if codec.kind == "float":
        return x
    if codec.kind == "int8":
        return (x * codec.scale if codec.scale != 1.0 else x).astype(jnp.int8)
    c = x.shape[-1]
    b = (x != 0).astype(jnp.uint8)
    if c % 8:
        b = jnp.pad(b, [(0, 0)] * (x.ndim - 1) + [(0, 8 - c % 8)])
    b = b.reshape(*x.shape[:-1], -1, 8)
    shifts = jnp.arange(8, dtype=jnp.uint8)
    return jnp.sum(b << shifts, axis=-1, dtype=jnp.uint8)


def decode(codec: Codec, e: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """The tensor ``encode`` stored, ``shape`` in ``dtype``."""
    if codec.kind == "float":
        return e
    if codec.kind == "int8":
        x = e.astype(dtype)
        return x * (1.0 / codec.scale) if codec.scale != 1.0 else x
    bits = (e[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & 1
    return bits.reshape(*e.shape[:-1], -1)[..., :shape[-1]].astype(dtype)


def compressed_apply(fn: Callable, codecs: tuple[Codec | None, ...], *args: jax.Array) -> jax.Array:
    """``fn(*args)``, keeping for the backward each ``args[i]`` encoded by ``codecs[i]`` (None: kept as is).

    ``fn`` must be hashable (a module-level function or a ``functools.partial`` of one with hashable
    arguments). The backward decodes the inputs and differentiates ``fn`` at them; for a layer
    linear in its input (a convolution, a matmul) XLA drops the recomputed output.
    """
    if len(codecs) != len(args):
        raise ValueError(f"{len(codecs)} codecs for {len(args)} arguments")
    return _apply(fn, codecs, *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _apply(fn, codecs, *args):
    return fn(*args)


def _stored(codecs, args):
    return tuple(a if c is None else checkpoint_name(encode(c, a), SPIKES) for c, a in zip(codecs, args, strict=True))


def _restored(codecs, stored, avals):
    return tuple(s if c is None else decode(c, s, a.shape, a.dtype)
                 for c, s, a in zip(codecs, stored, avals, strict=True))


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Aval:
    """An input's shape and dtype, carried through the residuals as static data."""

    shape: tuple[int, ...]
    dtype: jnp.dtype


def _apply_fwd(fn, codecs, *args):
    stored = _stored(codecs, args)
    avals = tuple(_Aval(tuple(a.shape), jnp.dtype(a.dtype)) for a in args)
    # The output from the decoded inputs (the same values): a recomputation then needs only what is stored.
    return fn(*_restored(codecs, stored, avals)), (stored, avals)


def _apply_bwd(fn, codecs, res, g):
    stored, avals = res
    _, vjp = jax.vjp(fn, *after(_restored(codecs, stored, avals), g))
    return vjp(g)


def after(tree, ct):
    """``tree`` with ``0 * c`` added to its floating arrays, ``c`` an element of the cotangent ``ct``.

    The values do not change (a NaN or inf cotangent makes the gradient NaN anyway), but work on them
    now depends on the cotangent: XLA cannot schedule it before the backward gets there, nor fuse it with
    the forward (reading the float input instead of its encoding). XLA:CPU drops optimization barriers
    early, so those do not serve. Arrays in host memory (parameters offloaded with
    ``snnjax.parallel.param_stream``) are left as they are: the device cannot compute on them (XLA schedules
    their transfer to the device).
    """
    leaf = next(a for a in jax.tree.leaves(ct) if jnp.issubdtype(a.dtype, jnp.inexact))
    zero = 0.0 * leaf.reshape(-1)[0]

    def tie(a):
        if not jnp.issubdtype(a.dtype, jnp.floating) or on_host(a):
            return a
        return a + zero.astype(a.dtype)

    return jax.tree.map(tie, tree)


_apply.defvjp(_apply_fwd, _apply_bwd)


@dataclasses.dataclass(frozen=True)
class EncodedInput:
    """A layer's ``conv_general_dilated`` / ``dot_general`` hook that keeps its input (the first argument)
    encoded by ``codec`` for the backward; ``inner`` is the hook it wraps."""

    codec: Codec
    inner: Callable

    def __call__(self, lhs: jax.Array, rhs: jax.Array, *args, **kwargs) -> jax.Array:
        fn = functools.partial(_call_inner, self.inner, args, tuple(sorted(kwargs.items())))
        return compressed_apply(fn, (self.codec, None), lhs, rhs)


def _call_inner(inner, args, kwargs, lhs, rhs):
    return inner(lhs, rhs, *args, **dict(kwargs))


_HOOKS = ("conv_general_dilated", "dot_general")


def set_input_codec(layer, codec: Codec | None) -> None:
    """Make ``layer`` keep its input encoded by ``codec`` for the backward (None: as it is).

    ``layer``: a convolution (``conv_general_dilated`` hook), a ``nnx.Linear`` / ``LinearGeneral``
    (``dot_general`` hook), or a module with an ``input_codec`` attribute that it applies itself.
    """
    for hook in _HOOKS:
        if hasattr(layer, hook):
            inner = getattr(layer, hook)
            inner = inner.inner if isinstance(inner, EncodedInput) else inner
            if inner is None:  # nnx.Linear's default
                inner = jax.lax.dot_general
            setattr(layer, hook, inner if codec is None else EncodedInput(codec, inner))
            return
    if not hasattr(layer, "input_codec"):
        raise TypeError(f"{type(layer).__name__} has no {' / '.join(_HOOKS)} hook nor an input_codec attribute")
    layer.input_codec = codec
