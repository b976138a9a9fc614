"""Spikformer (SpikingJelly's layout), channels-last and time-major.

Patch stem: four ``Conv3x3 -> BatchNorm -> MaxPool(3, 2, 1) -> LIF`` stages to
``embed_dims`` channels (a /16 patch grid), plus a residual
``Conv3x3 -> BatchNorm -> LIF`` positional encoding. Each block adds spiking
self-attention and a spiking MLP to the token stream ``[T, N, L, D]``. SSA per
head: ``(V K^T) Q * 0.125`` over the ``head_dim x head_dim`` channel product,
then a LIF with threshold 0.5. Logits ``[T, N, classes]`` from the token mean.
All LIF neurons: tau=2, detach_reset, Sigmoid(4) surrogate, hard reset to 0.

Tensor parallelism splits attention by whole heads: the fused q/k/v projection's
kernel is ``[D, 3, heads, head_dim]`` (torch's ``[3D, D]`` in the same channel
order, reshaped) and its BatchNorm ``[3, heads, head_dim]``, so sharding ``heads``
never splits a head; the output projection's kernel is ``[heads, head_dim, D]``
(row-parallel). The MLP is ``fc1`` column- / ``fc2`` row-parallel and the patch
stem alternates likewise; the positional-encoding conv and the head stay whole.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax import layers
from snnjax.layers.residuals import Codec, compressed_apply
from snnjax.models import remat
from snnjax.models.units import Unit, run_units
from snnjax.neurons import LIFNode
from snnjax.parallel.logical import alternate

_init = jax.nn.initializers.truncated_normal(0.02)


def _lif(tau, detach_reset, v_threshold=1.0):
    return LIFNode(tau=tau, detach_reset=detach_reset, v_threshold=v_threshold, step_mode="m")


class ConvBNLIF(nnx.Module):
    """``Conv3x3 (no bias) -> BatchNorm -> [MaxPool(3, 2, 1)] -> LIF`` on ``[T, N, H, W, C]``."""

    def __init__(self, cin, cout, pool, tau, detach_reset, *, rngs, dtype=None, param_dtype=None,
                 axes=("embed", "mlp")):
        self.pool = pool
        self.conv = layers.conv2d(cin, cout, 3, padding=1, use_bias=False, kernel_init=_init, rngs=rngs,
                                  dtype=dtype, param_dtype=param_dtype, axes=axes)
        self.bn = layers.BatchNorm(cout, dtype=dtype, param_dtype=param_dtype, axes=axes[1:])
        self.neuron = _lif(tau, detach_reset)

    def __call__(self, x):
        x = self.bn(self.conv(x))
        if self.pool:
            x = layers.max_pool2d(x, 3, 2, 1)
        return self.neuron(x)


class LinearBNLIF(nnx.Module):
    """Token-wise ``Linear (no bias) -> BatchNorm -> LIF`` on ``[T, N, L, D]``.

    torch: ``Conv1d(k=1)`` + ``BatchNorm1d``.

    ``din`` / ``dout`` may be tuples (the trailing input / output dims, e.g. ``(3, heads, head_dim)``);
    ``axes`` names the kernel's dims, the BatchNorm taking the output dims' names.
    """

    def __init__(self, din, dout, tau, detach_reset, *, rngs, dtype=None, param_dtype=None,
                 axes=("embed", "mlp")):
        kw = dict(use_bias=False, kernel_init=_init, rngs=rngs, dtype=dtype, param_dtype=param_dtype, axes=axes)
        if isinstance(din, int) and isinstance(dout, int):
            self.fc = layers.linear(din, dout, **kw)
        else:
            self.fc = layers.linear_general(din, dout, **kw)
        n_in = 1 if isinstance(din, int) else len(din)
        self.bn = layers.BatchNorm(dout, dtype=dtype, param_dtype=param_dtype, axes=tuple(axes)[n_in:])
        self.neuron = _lif(tau, detach_reset)

    def __call__(self, x):
        return self.neuron(self.bn(self.fc(x)))


class SpikingSelfAttention(nnx.Module):
    """SSA on ``[T, N, L, D]``; heads split ``D`` as ``(heads, head_dim)``.

    ``qkv``: ``D -> (3, heads, head_dim)`` (column-parallel over whole heads); ``proj``:
    ``(heads, head_dim) -> D`` (row-parallel), so attention costs one all-reduce under TP.
    """

    def __init__(self, dim, num_heads, tau, detach_reset, *, rngs, dtype=None, param_dtype=None):
        if dim % num_heads:
            raise ValueError(f"embed_dims={dim} must be divisible by num_heads={num_heads}")
        self.num_heads, self.scale = num_heads, 0.125
        heads = (num_heads, dim // num_heads)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.qkv = LinearBNLIF(dim, (3, *heads), tau, detach_reset, axes=("embed", "qkv", "heads", "head_dim"), **kw)
        self.attn_neuron = _lif(tau, detach_reset, v_threshold=0.5)
        self.proj = LinearBNLIF(heads, dim, tau, detach_reset, axes=("heads", "head_dim", "embed"), **kw)
        self.input_codec: Codec | None = None  # how the products keep the spikes q, k, v (snnjax.models.remat)

    def __call__(self, x):
        qkv = self.qkv(x)  # [T, N, L, 3, heads, hd]
        q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]  # [T, N, L, heads, hd]
        c = self.input_codec
        if c is None:
            vk = _vk(v, k)
            y = _vkq(vk, q)
        else:  # vk holds counts up to L (too many for int8): kept as it is
            vk = compressed_apply(_vk, (c, c), v, k)
            y = compressed_apply(_vkq, (None, c), vk, q)
        return self.proj(self.attn_neuron(y * self.scale))


def _vk(v, k):
    return jnp.einsum("...lhd,...lhe->...hde", v, k)


def _vkq(vk, q):
    return jnp.einsum("...hde,...lhe->...lhd", vk, q)


class SpikformerMLP(nnx.Module):
    """``LinearBNLIF(D -> hidden) -> LinearBNLIF(hidden -> D)``."""

    def __init__(self, dim, hidden, tau, detach_reset, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.fc1 = LinearBNLIF(dim, hidden, tau, detach_reset, axes=("embed", "mlp"), **kw)
        self.fc2 = LinearBNLIF(hidden, dim, tau, detach_reset, axes=("mlp", "embed"), **kw)

    def __call__(self, x):
        return self.fc2(self.fc1(x))


class SpikformerBlock(nnx.Module):
    """``x + SSA(x)`` then ``x + MLP(x)`` on tokens ``[T, N, L, D]``."""

    def __init__(self, dim, num_heads, mlp_ratio, tau, detach_reset, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.attn = SpikingSelfAttention(dim, num_heads, tau, detach_reset, **kw)
        self.mlp = SpikformerMLP(dim, int(dim * mlp_ratio), tau, detach_reset, **kw)

    def __call__(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class Spikformer(nnx.Module):
    """Input ``[T, N, H, W, C]`` or a static image ``[N, H, W, C]`` repeated ``T`` times; logits ``[T, N, classes]``."""

    def __init__(self, *, T: int = 4, in_channels: int = 3, img_size: int | tuple[int, int] = 224,
                 patch_size: int = 16, num_classes: int = 1000, embed_dims: int = 256, num_heads: int = 8,
                 mlp_ratio: float = 4.0, depths: int = 4, tau: float = 2.0, detach_reset: bool = True,
                 rngs: nnx.Rngs, dtype=None, param_dtype=None):
        if patch_size != 16:
            raise ValueError(f"the patch stem is a fixed 4-stage /16 pipeline; patch_size must be 16, got {patch_size}")
        if embed_dims % 8:
            raise ValueError(f"embed_dims must be divisible by 8 (stem widths D/8, D/4, D/2, D), got {embed_dims}")
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.T = T
        widths = [embed_dims // 8, embed_dims // 4, embed_dims // 2, embed_dims]
        stages, cin = [], in_channels
        for i, w in enumerate(widths):
            stages.append(ConvBNLIF(cin, w, True, tau, detach_reset, axes=alternate(i), **kw))
            cin = w
        self.stages = nnx.List(stages)
        self.positional_encoding = ConvBNLIF(embed_dims, embed_dims, False, tau, detach_reset,
                                             axes=("embed", "embed"), **kw)
        self.blocks = nnx.List([SpikformerBlock(embed_dims, num_heads, mlp_ratio, tau, detach_reset, **kw)
                                for _ in range(depths)])
        self.head = layers.linear(embed_dims, num_classes, kernel_init=_init, rngs=rngs, dtype=dtype,
                                  param_dtype=param_dtype, axes=("embed", "classes"))

    def units(self) -> list[Unit]:
        """Each patch stage (``stages.i``), the positional encoding (to tokens ``[T, N, L, D]``), each block,
        the head: the patch stages at full resolution hold most of the activations, so each is its own unit."""
        stages = [remat.unit(self, f"stages.{i}", (f"stages.{i}",), stage,
                              functools.partial(_first_stage, self.T) if i == 0 else _call)
                  for i, stage in enumerate(self.stages)]
        encoding = remat.unit(self, "positional_encoding", ("positional_encoding",), self.positional_encoding,
                              _encode_positions)
        blocks = [remat.unit(self, f"blocks.{i}", (f"blocks.{i}",), block, _call)
                  for i, block in enumerate(self.blocks)]
        return stages + [encoding] + blocks + [remat.unit(self, "head", ("head",), self.head, _head)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The layers that consume spikes (``snnjax.models.remat``): the stem's convs after the first, the
        attention products, the projections after a neuron; q/k/v and fc1 take the residual stream, a
        sum of spike tensors (small integers)."""
        out = [(stage.conv, "binary") for stage in list(self.stages)[1:]]
        out.append((self.positional_encoding.conv, "binary"))
        for b in self.blocks:
            out += [(b.attn.qkv.fc, "counts"), (b.attn, "binary"), (b.attn.proj.fc, "binary"),
                    (b.mlp.fc1.fc, "counts"), (b.mlp.fc2.fc, "binary")]
        return out

    def __call__(self, x: jax.Array) -> jax.Array:
        return run_units(self.units(), x)


def _call(module: nnx.Module, x: jax.Array) -> jax.Array:
    return module(x)


def _first_stage(T: int, stage: ConvBNLIF, x: jax.Array) -> jax.Array:
    """The first patch stage on ``[T, N, H, W, C]``, or on a static image ``[N, H, W, C]`` repeated ``T`` times."""
    if x.ndim == 4:
        x = jnp.broadcast_to(x[None], (T,) + x.shape)
    elif x.ndim != 5:
        raise ValueError(f"expected [N, H, W, C] or [T, N, H, W, C] input, got shape {x.shape}")
    return stage(x)


def _encode_positions(encoding: ConvBNLIF, x: jax.Array) -> jax.Array:
    """``x + encoding(x)`` on ``[T, N, H, W, D]``, flattened to tokens ``[T, N, H * W, D]``."""
    x = x + encoding(x)
    t, n, h, w, d = x.shape
    return x.reshape(t, n, h * w, d)


def _head(head: nnx.Module, x: jax.Array) -> jax.Array:
    return head(jnp.mean(x, axis=2))


def spikformer_ti(**kwargs) -> Spikformer:
    """Spikformer-Ti: 256 dims, depth 4, 8 heads."""
    return Spikformer(**{"embed_dims": 256, "num_heads": 8, "depths": 4, "mlp_ratio": 4.0, **kwargs})


def spikformer_s(**kwargs) -> Spikformer:
    """Spikformer-S: 384 dims, depth 6, 12 heads."""
    return Spikformer(**{"embed_dims": 384, "num_heads": 12, "depths": 6, "mlp_ratio": 4.0, **kwargs})
