"""Spike-Driven Transformer v1 (SpikingJelly's ``SpikeDrivenTransformer``), channels-last and time-major.

Patch embedding: three ``Conv3x3 -> BatchNorm -> SN -> [MaxPool(3, 2, 1)]`` stages to ``D/8, D/4, D/2``
channels, then ``Conv3x3 -> BatchNorm -> [MaxPool]`` to ``D`` channels whose output ``u`` (real-valued)
gets a relative position embedding, ``u + BN(Conv3x3(SN(u)))``. ``pooling_stat`` (four ``0``/``1``)
says which stages pool (``"1111"``: a /16 token grid). Tokens ``[T, N, L, D]`` then pass ``depths``
blocks, each Spike-Driven Self-Attention (``snnjax.models.spiking_attention``) and an MLP with
membrane shortcuts, ``u + BN(W2 SN(h)) (+ h when hidden == D)`` with ``h = BN(W1 SN(u))``. The head
fires a neuron on the token mean and maps it to logits ``[T, N, classes]`` (SpikingJelly's model
returns their time mean, ``out.mean(0)``: the zoo's contract is per-step logits, the trainer's loss
averages over T).

Neurons: ``spiking_neuron`` and the neuron keywords (``**kwargs``), as SpikingJelly builds them
(``snnjax.models.neuron_options``): with None, LIF (tau 2) with the given keywords, inside attention
over the attention sites' own defaults (``detach_reset=True``, the attention map's threshold 0.5); with
a class, that class with the given keywords at every site, attention included.

Tensor parallelism: the stem alternates column- / row-parallel convs (the fourth is row-parallel,
so tokens leave it whole); attention splits whole heads; the MLP is ``fc1`` column- / ``fc2``
row-parallel. The position-embedding conv and the head stay whole.
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
from snnjax.models.neuron_options import Neurons
from snnjax.models.registry import DataShape, Rule, image_frame, register, register_rules
from snnjax.models.spiking_attention import TORCH_INIT, Projection, SpikeDrivenSelfAttention
from snnjax.models.units import Unit, run_units
from snnjax.neurons.modules import BaseNode
from snnjax.parallel.logical import alternate


def _conv(cin, cout, axes, *, use_bias=True, rngs, dtype, param_dtype):
    return layers.conv2d(cin, cout, 3, padding=1, use_bias=use_bias, kernel_init=TORCH_INIT, rngs=rngs,
                         dtype=dtype, param_dtype=param_dtype, axes=axes)


class PatchStage(nnx.Module):
    """``Conv3x3 -> BatchNorm -> SN -> [MaxPool(3, 2, 1)]`` on ``[T, N, H, W, C]``."""

    def __init__(self, cin, cout, pool, neurons: Neurons, axes, *, rngs, dtype=None, param_dtype=None):
        self.pool = pool
        self.conv = _conv(cin, cout, axes, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.bn = layers.BatchNorm(cout, dtype=dtype, param_dtype=param_dtype, axes=axes[1:])
        self.lif = neurons.make()

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.lif(self.bn(self.conv(x)))
        return layers.max_pool2d(x, 3, 2, 1) if self.pool else x


class FinalStage(nnx.Module):
    """``u = [MaxPool](BN(Conv3x3 x))``, then ``u + BN(Conv3x3(SN(u)))`` flattened to tokens ``[T, N, L, D]``."""

    def __init__(self, cin, dim, pool, neurons: Neurons, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.pool = pool
        self.conv = _conv(cin, dim, alternate(3), **kw)
        self.bn = layers.BatchNorm(dim, dtype=dtype, param_dtype=param_dtype, axes=("embed",))
        self.lif = neurons.make()
        self.rpe_conv = _conv(dim, dim, ("embed", "embed"), use_bias=False, **kw)
        self.rpe_bn = layers.BatchNorm(dim, dtype=dtype, param_dtype=param_dtype, axes=("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        u = self.bn(self.conv(x))
        if self.pool:
            u = layers.max_pool2d(u, 3, 2, 1)
        u = u + self.rpe_bn(self.rpe_conv(self.lif(u)))
        t, n, h, w, d = u.shape
        return u.reshape(t, n, h * w, d)


class SDTMLP(nnx.Module):
    """``h = BN(W1 SN(u)) (+ u if hidden == D)``, then ``BN(W2 SN(h)) + (h if hidden == D else u)``."""

    def __init__(self, dim, hidden, neurons: Neurons, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.residual = dim == hidden
        self.lif1 = neurons.make()
        self.fc1 = Projection(dim, hidden, use_bias=True, axes=("embed", "mlp"), **kw)
        self.lif2 = neurons.make()
        self.fc2 = Projection(hidden, dim, use_bias=True, axes=("mlp", "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.fc1(self.lif1(x))
        if self.residual:
            h = x = h + x
        return self.fc2(self.lif2(h)) + x


class SDTBlock(nnx.Module):
    """Spike-Driven Self-Attention then the MLP, each with its membrane shortcut, on ``[T, N, L, D]``."""

    def __init__(self, dim, num_heads, mlp_ratio, neurons: Neurons, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.attn = SpikeDrivenSelfAttention(dim, num_heads, neurons, **kw)
        self.mlp = SDTMLP(dim, int(dim * mlp_ratio), neurons, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.mlp(self.attn(x))


class SpikeDrivenTransformer(nnx.Module):
    """Input ``[T, N, H, W, C]`` or a static image ``[N, H, W, C]`` repeated ``T`` times; logits ``[T, N, classes]``
    (SpikingJelly's: ``out.mean(0)``). SpikingJelly's keywords; ``spiking_neuron`` and ``**kwargs`` (the neuron
    keywords): see the module docstring. ``rngs``: default ``nnx.Rngs(0)``."""

    def __init__(self, T: int = 4, in_channels: int = 3, num_classes: int = 1000, embed_dims: int = 384,
                 num_heads: int = 8, depths: int = 8, mlp_ratio: float = 4.0, pooling_stat: str = "1111",
                 spiking_neuron: type[BaseNode] | str | None = None,
                 *, rngs: nnx.Rngs | None = None, dtype=None, param_dtype=None, **kwargs):
        if len(pooling_stat) != 4 or set(pooling_stat) - {"0", "1"}:
            raise ValueError(f"pooling_stat must be four characters 0/1 (which patch stages pool), "
                             f"got {pooling_stat!r}")
        if embed_dims % 8:
            raise ValueError(f"embed_dims must be divisible by 8 (stem widths D/8, D/4, D/2, D), got {embed_dims}")
        if embed_dims % num_heads:
            raise ValueError(f"embed_dims={embed_dims} must be divisible by num_heads={num_heads}")
        neurons = Neurons.of(spiking_neuron, kwargs, model=type(self).__name__)
        rngs = nnx.Rngs(0) if rngs is None else rngs
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.T = T
        pools = [c == "1" for c in pooling_stat]
        widths, stages, cin = (embed_dims // 8, embed_dims // 4, embed_dims // 2), [], in_channels
        for i, w in enumerate(widths):
            stages.append(PatchStage(cin, w, pools[i], neurons, alternate(i), **kw))
            cin = w
        self.stages = nnx.List(stages)
        self.final = FinalStage(cin, embed_dims, pools[3], neurons, **kw)
        self.blocks = nnx.List([SDTBlock(embed_dims, num_heads, mlp_ratio, neurons, **kw) for _ in range(depths)])
        self.head_lif = neurons.make()
        self.head = layers.linear(embed_dims, num_classes, kernel_init=TORCH_INIT, rngs=rngs, dtype=dtype,
                                  param_dtype=param_dtype, axes=("embed", "classes"))

    def units(self) -> list[Unit]:
        """Each patch stage (``stages.i``), the final stage with the position embedding (to tokens), each
        block, the head (neuron and linear)."""
        stages = [remat.unit(self, f"stages.{i}", (f"stages.{i}",), stage,
                              functools.partial(_first, self.T) if i == 0 else _call)
                  for i, stage in enumerate(self.stages)]
        final = [remat.unit(self, "final", ("final",), self.final, _call)]
        blocks = [remat.unit(self, f"blocks.{i}", (f"blocks.{i}",), b, _call) for i, b in enumerate(self.blocks)]
        return stages + final + blocks + [remat.unit(self, "head", ("head_lif", "head"), self, _head)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The layers that consume spikes (``snnjax.models.remat``): every conv / projection after a neuron."""
        out = [(stage.conv, "binary") for stage in list(self.stages)[1:]]
        out += [(self.final.conv, "binary"), (self.final.rpe_conv, "binary"), (self.head, "binary")]
        for b in self.blocks:
            a = b.attn
            out += [(a.q.fc, "binary"), (a.k.fc, "binary"), (a.v.fc, "binary"), (a.proj.fc, "binary"),
                    (b.mlp.fc1.fc, "binary"), (b.mlp.fc2.fc, "binary")]
        return out

    def __call__(self, x: jax.Array) -> jax.Array:
        return run_units(self.units(), x)


def _call(module: nnx.Module, x: jax.Array) -> jax.Array:
    return module(x)


def _first(T: int, stage: nnx.Module, x: jax.Array) -> jax.Array:
    """The first stage on ``[T, N, H, W, C]``, or on a static image ``[N, H, W, C]`` repeated ``T`` times."""
    if x.ndim == 4:
        x = jnp.broadcast_to(x[None], (T,) + x.shape)
    elif x.ndim != 5:
        raise ValueError(f"expected [N, H, W, C] or [T, N, H, W, C] input, got shape {x.shape}")
    return stage(x)


def _head(model: SpikeDrivenTransformer, x: jax.Array) -> jax.Array:
    return model.head(model.head_lif(jnp.mean(x, axis=2)))


def sdt_8_384(T: int = 4, in_channels: int = 3, num_classes: int = 1000,
              spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> SpikeDrivenTransformer:
    """SpikingJelly's ``sdt_8_384``: 384 dims, depth 8, 8 heads; logits ``[T, N, classes]``."""
    return SpikeDrivenTransformer(T=T, in_channels=in_channels, num_classes=num_classes, embed_dims=384, num_heads=8,
                                  depths=8, spiking_neuron=spiking_neuron, **kwargs)


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"in_channels": image_frame(data, "sdt")[2], "num_classes": data.num_classes, "T": data.time_steps}


register("sdt", SpikeDrivenTransformer, _sizes, ("in_channels", "num_classes", "T"))

# SpikingJelly's spike_driven_transformer keys; its 1x1 Conv2d / Conv1d projections are linear.
_I = r"(?P<i>\d+)"
register_rules(SpikeDrivenTransformer, [
    Rule(rf"patch_embed\.stages\.{_I}\.0", "stages.{i}.conv", "conv"),
    Rule(rf"patch_embed\.stages\.{_I}\.1", "stages.{i}.bn", "bn"),
    Rule(rf"patch_embed\.stages\.{_I}\.2", "stages.{i}.lif", "neuron"),
    Rule(r"patch_embed\.final_stage\.0", "final.conv", "conv"),
    Rule(r"patch_embed\.final_stage\.1", "final.bn", "bn"),
    Rule(r"patch_embed\.final_lif", "final.lif", "neuron"),
    Rule(r"patch_embed\.rpe_conv", "final.rpe_conv", "conv"),
    Rule(r"patch_embed\.rpe_bn", "final.rpe_bn", "bn"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<p>q|k|v|proj)_conv", "blocks.{i}.attn.{p}.fc", "linear"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<p>q|k|v|proj)_bn", "blocks.{i}.attn.{p}.bn", "bn"),
    Rule(rf"blocks\.{_I}\.attn\.(?P<n>shortcut|q|k|v|attn)_lif", "blocks.{i}.attn.{n}_lif", "neuron"),
    Rule(rf"blocks\.{_I}\.mlp\.fc(?P<j>[12])", "blocks.{i}.mlp.fc{j}.fc", "linear"),
    Rule(rf"blocks\.{_I}\.mlp\.bn(?P<j>[12])", "blocks.{i}.mlp.fc{j}.bn", "bn"),
    Rule(rf"blocks\.{_I}\.mlp\.lif(?P<j>[12])", "blocks.{i}.mlp.lif{j}", "neuron"),
    Rule(r"head_lif", "head_lif", "neuron"),
    Rule(r"head", "head", "linear"),
])
