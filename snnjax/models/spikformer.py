"""Spikformer (SpikingJelly's ``Spikformer``), channels-last and time-major.

Patch stem: four ``Conv3x3 -> BatchNorm -> [MaxPool(3, 2, 1)] -> LIF`` stages to ``embed_dims``
channels (all four pool with ``patch_size=16``, the last two with ``patch_size=4``: a /16 or /4 patch
grid), plus a residual ``Conv3x3 -> BatchNorm -> LIF`` positional encoding. Each block adds spiking
self-attention (``snnjax.models.spiking_attention.SpikingSelfAttention``) and a spiking MLP
(``SN(BN(W2 SN(BN(W1 x))))``) to the token stream ``[T, N, L, D]``. Logits ``[T, N, classes]`` from the
token mean, per step as SpikingJelly's. Every conv / linear has no bias but the head; weights start
from a truncated normal (std 0.02).

Neurons (``snnjax.models.neuron_options``): with ``spiking_neuron=None`` every neuron is SpikingJelly's
paper LIF (``tau=2``, ``detach_reset``; the attention map's threshold 0.5), the given keywords over it
except that, as in SpikingJelly, ``tau`` and ``detach_reset`` do not reach the attention neurons; with a
class, that class with the given keywords at every site.

Tensor parallelism splits attention by whole heads: the fused q/k/v projection's
kernel is ``[D, 3, heads, head_dim]`` (torch's ``[3D, D]`` in the same channel
order, reshaped) and its BatchNorm ``[3, heads, head_dim]``, so sharding ``heads``
never splits a head; the output projection's kernel is ``[heads, head_dim, D]``
(row-parallel). The MLP is ``fc1`` column- / ``fc2`` row-parallel and the patch
stem alternates likewise; the positional-encoding conv and the head stay whole.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax import layers
from snnjax.models import remat
from snnjax.models.neuron_options import ATTENTION, Neurons
from snnjax.models.registry import DataShape, Rule, image_frame, register, register_rules
from snnjax.models.spiking_attention import Projection, SpikingSelfAttention
from snnjax.models.units import Unit, run_units
from snnjax.neurons.modules import BaseNode
from snnjax.parallel.logical import alternate

_init = jax.nn.initializers.truncated_normal(0.02)
NEURON_DEFAULTS = ATTENTION  # SpikingJelly's paper LIF at every Spikformer site: tau 2, detach_reset


class ConvBNLIF(nnx.Module):
    """``Conv3x3 (no bias) -> BatchNorm -> [MaxPool(3, 2, 1)] -> LIF`` on ``[T, N, H, W, C]``."""

    def __init__(self, cin, cout, pool, neurons: Neurons, *, rngs, dtype=None, param_dtype=None,
                 axes=("embed", "mlp")):
        self.pool = pool
        self.conv = layers.conv2d(cin, cout, 3, padding=1, use_bias=False, kernel_init=_init, rngs=rngs,
                                  dtype=dtype, param_dtype=param_dtype, axes=axes)
        self.bn = layers.BatchNorm(cout, dtype=dtype, param_dtype=param_dtype, axes=axes[1:])
        self.neuron = neurons.make(**NEURON_DEFAULTS)

    def __call__(self, x):
        x = self.bn(self.conv(x))
        if self.pool:
            x = layers.max_pool2d(x, 3, 2, 1)
        return self.neuron(x)


class SpikformerMLP(nnx.Module):
    """``SN(BN(W2 SN(BN(W1 x))))`` on tokens ``[T, N, L, D]`` (no biases)."""

    def __init__(self, dim, hidden, neurons: Neurons, *, rngs, dtype=None, param_dtype=None):
        kw = dict(use_bias=False, kernel_init=_init, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.fc1 = Projection(dim, hidden, axes=("embed", "mlp"), **kw)
        self.neuron1 = neurons.make(**NEURON_DEFAULTS)
        self.fc2 = Projection(hidden, dim, axes=("mlp", "embed"), **kw)
        self.neuron2 = neurons.make(**NEURON_DEFAULTS)

    def __call__(self, x):
        return self.neuron2(self.fc2(self.neuron1(self.fc1(x))))


class SpikformerBlock(nnx.Module):
    """``x + SSA(x)`` then ``x + MLP(x)`` on tokens ``[T, N, L, D]``."""

    def __init__(self, dim, num_heads, mlp_ratio, neurons: Neurons, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        # SpikingJelly: with no neuron class, tau and detach_reset stay the attention's own defaults.
        attn_neurons = neurons.without("tau", "detach_reset") if neurons.spiking_neuron is None else neurons
        self.attn = SpikingSelfAttention(dim, num_heads, attn_neurons, kernel_init=_init, **kw)
        self.mlp = SpikformerMLP(dim, int(dim * mlp_ratio), neurons, **kw)

    def __call__(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class Spikformer(nnx.Module):
    """Input ``[T, N, H, W, C]`` or a static image ``[N, H, W, C]`` repeated ``T`` times; logits ``[T, N, classes]``.

    SpikingJelly's keywords (``img_size_h`` / ``img_size_w`` only describe the input: the model takes any
    size); ``spiking_neuron`` and ``**kwargs`` (the neuron keywords): see the module docstring. ``rngs``:
    default ``nnx.Rngs(0)``.
    """

    def __init__(self, T: int = 4, in_channels: int = 3, img_size_h: int = 224, img_size_w: int = 224,
                 patch_size: int = 16, num_classes: int = 1000, embed_dims: int = 256, num_heads: int = 8,
                 mlp_ratio: float = 4.0, depths: int = 4, spiking_neuron: type[BaseNode] | str | None = None,
                 *, rngs: nnx.Rngs | None = None, dtype=None, param_dtype=None, **kwargs):
        if patch_size not in (4, 16):
            raise ValueError(f"patch_size must be 4 or 16 (the stem pools in its last 2 or all 4 stages), "
                             f"got {patch_size}")
        if embed_dims % 8:
            raise ValueError(f"embed_dims must be divisible by 8 (stem widths D/8, D/4, D/2, D), got {embed_dims}")
        neurons = Neurons.of(spiking_neuron, kwargs, model="Spikformer")
        rngs = nnx.Rngs(0) if rngs is None else rngs
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.img_size = (img_size_h, img_size_w)
        self.T = T
        widths = [embed_dims // 8, embed_dims // 4, embed_dims // 2, embed_dims]
        stages, cin = [], in_channels
        for i, w in enumerate(widths):
            stages.append(ConvBNLIF(cin, w, i >= (2 if patch_size == 4 else 0), neurons, axes=alternate(i), **kw))
            cin = w
        self.stages = nnx.List(stages)
        self.positional_encoding = ConvBNLIF(embed_dims, embed_dims, False, neurons, axes=("embed", "embed"), **kw)
        self.blocks = nnx.List([SpikformerBlock(embed_dims, num_heads, mlp_ratio, neurons, **kw)
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


def spikformer_ti(T: int = 4, in_channels: int = 3, img_size_h: int = 224, img_size_w: int = 224,
                  num_classes: int = 1000, spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> Spikformer:
    """SpikingJelly's ``spikformer_ti``: 256 dims, depth 4, 8 heads, MLP ratio 4."""
    return Spikformer(T=T, in_channels=in_channels, img_size_h=img_size_h, img_size_w=img_size_w,
                      num_classes=num_classes, embed_dims=256, num_heads=8, mlp_ratio=4.0, depths=4,
                      spiking_neuron=spiking_neuron, **kwargs)


def spikformer_s(T: int = 4, in_channels: int = 3, img_size_h: int = 224, img_size_w: int = 224,
                 num_classes: int = 1000, spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> Spikformer:
    """SpikingJelly's ``spikformer_s``: 384 dims, depth 6, 12 heads, MLP ratio 4."""
    return Spikformer(T=T, in_channels=in_channels, img_size_h=img_size_h, img_size_w=img_size_w,
                      num_classes=num_classes, embed_dims=384, num_heads=12, mlp_ratio=4.0, depths=6,
                      spiking_neuron=spiking_neuron, **kwargs)


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = image_frame(data, "spikformer")
    return {"in_channels": c, "img_size_h": h, "img_size_w": w, "num_classes": data.num_classes, "T": data.time_steps}


register("spikformer", Spikformer, _sizes, ("in_channels", "img_size_h", "img_size_w", "num_classes", "T"))

# SpikingJelly's spikformer keys.
register_rules(Spikformer, [
    Rule(r"patch_embed\.stages\.(\d+)\.conv_bn\.block\.0", "stages.{1}.conv", "conv"),
    Rule(r"patch_embed\.stages\.(\d+)\.conv_bn\.block\.1", "stages.{1}.bn", "bn"),
    Rule(r"patch_embed\.positional_encoding\.conv_bn\.block\.0", "positional_encoding.conv", "conv"),
    Rule(r"patch_embed\.positional_encoding\.conv_bn\.block\.1", "positional_encoding.bn", "bn"),
    Rule(r"blocks\.(\d+)\.attn\.(qkv|proj)_conv_bn\.0", "blocks.{1}.attn.{2}.fc", "linear"),
    Rule(r"blocks\.(\d+)\.attn\.(qkv|proj)_conv_bn\.1", "blocks.{1}.attn.{2}.bn", "bn"),
    Rule(r"blocks\.(\d+)\.mlp\.(fc[12])\.0", "blocks.{1}.mlp.{2}.fc", "linear"),
    Rule(r"blocks\.(\d+)\.mlp\.(fc[12])\.1", "blocks.{1}.mlp.{2}.bn", "bn"),
    Rule(r"patch_embed\.stages\.(\d+)\.neuron", "stages.{1}.neuron", "neuron"),
    Rule(r"patch_embed\.positional_encoding\.neuron", "positional_encoding.neuron", "neuron"),
    Rule(r"blocks\.(\d+)\.attn\.(qkv|attn|proj)_lif", "blocks.{1}.attn.{2}_lif", "neuron"),
    Rule(r"blocks\.(\d+)\.mlp\.(neuron[12])", "blocks.{1}.mlp.{2}", "neuron"),
    Rule(r"head", "head", "linear"),
])
