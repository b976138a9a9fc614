"""QKFormer (SpikingJelly's ``QKFormer``), channels-last and time-major.

Three stages of hierarchical spiking patch embedding and transformer blocks at ``D/4, D/2, D``
channels: the first embedding, ``a = SN(MaxPool(BN(Conv3x3 x)))``, then
``SN(BN(Conv3x3 SN(MaxPool(BN(Conv3x3 a))))) + SN(BN(Conv1x1/2 a))`` (a /4 grid); the next two,
``SN(BN(Conv3x3 SN(MaxPool(BN(Conv3x3 x))))) + SN(BN(Conv1x1/2 x))`` (/8, /16). The blocks of
the first two stages use Q-K attention (``qka_type`` token or channel), the third stage's
Spikformer's SSA (``snnjax.models.spiking_attention``); each block is ``x + attn(x)`` then
``x + SN(BN(W2 SN(BN(W1 x))))``. Logits ``[T, N, classes]`` from the token mean (SpikingJelly's model
returns their time mean, ``out.mean(0)``: the zoo's contract is per-step logits, the trainer's loss
averages over T). Every conv / linear but the attention projections has a bias.

Neurons: ``spiking_neuron`` and the neuron keywords (``**kwargs``), as SpikingJelly builds them
(``snnjax.models.neuron_options``): with None, LIF (tau 2) with the given keywords, inside attention
over the attention sites' own defaults (``detach_reset=True``, the attention map's threshold 0.5); with
a class, that class with the given keywords at every site, attention included.

Tensor parallelism: each embedding's convs are column- then row-parallel (the first embedding's
third conv whole, its shortcut row-parallel on the split first activation; the later shortcuts
whole); attention splits whole heads; the MLP is ``fc1`` column- / ``fc2`` row-parallel.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from snnjax import layers
from snnjax.models import remat
from snnjax.models.neuron_options import Neurons
from snnjax.models.registry import DataShape, Rule, image_frame, register, register_rules
from snnjax.models.spiking_attention import TORCH_INIT, Projection, QKAttention, SpikingSelfAttention
from snnjax.models.units import Unit, run_units
from snnjax.neurons.modules import BaseNode


class ConvBN(nnx.Module):
    """``Conv (bias) -> BatchNorm`` on ``[T, N, H, W, C]``; 3x3 padding 1, or 1x1 with stride 2."""

    def __init__(self, cin, cout, kernel, axes, *, rngs, dtype=None, param_dtype=None):
        stride, padding = (1, 1) if kernel == 3 else (2, 0)
        self.conv = layers.conv2d(cin, cout, kernel, stride=stride, padding=padding, kernel_init=TORCH_INIT,
                                  rngs=rngs, dtype=dtype, param_dtype=param_dtype, axes=axes)
        self.bn = layers.BatchNorm(cout, dtype=dtype, param_dtype=param_dtype, axes=axes[1:])

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(x))


class PatchEmbedInit(nnx.Module):
    """The first embedding: ``[T, N, H, W, C] -> [T, N, H/4, W/4, out]`` (see the module docstring)."""

    def __init__(self, cin, cout, neurons: Neurons, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        hidden = cout // 2
        self.conv1, self.lif1 = ConvBN(cin, hidden, 3, ("embed", "mlp"), **kw), neurons.make()
        self.conv2, self.lif2 = ConvBN(hidden, cout, 3, ("mlp", "embed"), **kw), neurons.make()
        self.conv3, self.lif3 = ConvBN(cout, cout, 3, ("embed", "embed"), **kw), neurons.make()
        self.shortcut, self.shortcut_lif = ConvBN(hidden, cout, 1, ("mlp", "embed"), **kw), neurons.make()

    def __call__(self, x: jax.Array) -> jax.Array:
        a = self.lif1(layers.max_pool2d(self.conv1(x), 3, 2, 1))
        y = self.lif2(layers.max_pool2d(self.conv2(a), 3, 2, 1))
        return self.lif3(self.conv3(y)) + self.shortcut_lif(self.shortcut(a))


class PatchEmbedStage(nnx.Module):
    """A later embedding: ``[T, N, H, W, cin] -> [T, N, H/2, W/2, cout]``."""

    def __init__(self, cin, cout, neurons: Neurons, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.conv1, self.lif1 = ConvBN(cin, cout, 3, ("embed", "mlp"), **kw), neurons.make()
        self.conv2, self.lif2 = ConvBN(cout, cout, 3, ("mlp", "embed"), **kw), neurons.make()
        self.shortcut, self.shortcut_lif = ConvBN(cin, cout, 1, ("embed", "embed"), **kw), neurons.make()

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.lif1(layers.max_pool2d(self.conv1(x), 3, 2, 1))
        return self.lif2(self.conv2(y)) + self.shortcut_lif(self.shortcut(x))


class QKFormerMLP(nnx.Module):
    """``SN(BN(W2 SN(BN(W1 x))))`` on tokens (biases on both)."""

    def __init__(self, dim, hidden, neurons: Neurons, *, rngs, dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.fc1, self.lif1 = Projection(dim, hidden, use_bias=True, axes=("embed", "mlp"), **kw), neurons.make()
        self.fc2, self.lif2 = Projection(hidden, dim, use_bias=True, axes=("mlp", "embed"), **kw), neurons.make()

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.lif2(self.fc2(self.lif1(self.fc1(x))))


class QKFormerBlock(nnx.Module):
    """``x + attn(x)`` then ``x + MLP(x)`` on ``[T, N, H, W, D]`` (the tokens of the grid)."""

    def __init__(self, dim, num_heads, mlp_ratio, qka_type, self_attention, neurons: Neurons, *, rngs,
                 dtype=None, param_dtype=None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.attn = (SpikingSelfAttention(dim, num_heads, neurons, **kw) if self_attention
                     else QKAttention(dim, num_heads, qka_type, neurons, **kw))
        self.mlp = QKFormerMLP(dim, int(dim * mlp_ratio), neurons, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        t, n, h, w, d = x.shape
        x = x.reshape(t, n, h * w, d)
        x = x + self.attn(x)
        x = x + self.mlp(x)
        return x.reshape(t, n, h, w, d)


class QKFormer(nnx.Module):
    """Input ``[T, N, H, W, C]`` or a static image ``[N, H, W, C]`` repeated ``T`` times; logits ``[T, N, classes]``
    (SpikingJelly's: ``out.mean(0)``). SpikingJelly's keywords; ``spiking_neuron`` and ``**kwargs`` (the neuron
    keywords): see the module docstring. ``rngs``: default ``nnx.Rngs(0)``."""

    def __init__(self, T: int = 4, in_channels: int = 3, num_classes: int = 1000, embed_dims: int = 384,
                 num_heads: Sequence[int] = (3, 6, 6), depths: Sequence[int] = (1, 2, 7), mlp_ratio: float = 4.0,
                 qka_type: str = "token", spiking_neuron: type[BaseNode] | str | None = None,
                 *, rngs: nnx.Rngs | None = None, dtype=None, param_dtype=None, **kwargs):
        num_heads, depths = tuple(num_heads), tuple(depths)
        if len(num_heads) != 3 or len(depths) != 3:
            raise ValueError(f"num_heads and depths take one value per stage (three each), got {num_heads}, {depths}")
        if embed_dims % 4:
            raise ValueError(f"embed_dims must be divisible by 4 (stage widths D/4, D/2, D), got {embed_dims}")
        neurons = Neurons.of(spiking_neuron, kwargs, model=type(self).__name__)
        rngs = nnx.Rngs(0) if rngs is None else rngs
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.T = T
        dims = (embed_dims // 4, embed_dims // 2, embed_dims)
        self.patch_embed1 = PatchEmbedInit(in_channels, dims[0], neurons, **kw)
        self.patch_embed2 = PatchEmbedStage(dims[0], dims[1], neurons, **kw)
        self.patch_embed3 = PatchEmbedStage(dims[1], dims[2], neurons, **kw)
        for s in range(3):
            setattr(self, f"stage{s + 1}", nnx.List([
                QKFormerBlock(dims[s], num_heads[s], mlp_ratio, qka_type, s == 2, neurons, **kw)
                for _ in range(depths[s])]))
        self.head = layers.linear(embed_dims, num_classes, kernel_init=TORCH_INIT, rngs=rngs, dtype=dtype,
                                  param_dtype=param_dtype, axes=("embed", "classes"))

    def units(self) -> list[Unit]:
        """Per stage: its patch embedding (``patch_embedS``) and each block (``stageS.i``); then the head."""
        out = []
        for s in (1, 2, 3):
            embed = getattr(self, f"patch_embed{s}")
            call = functools.partial(_first, self.T) if s == 1 else _call
            out.append(remat.unit(self, f"patch_embed{s}", (f"patch_embed{s}",), embed, call))
            out += [remat.unit(self, f"stage{s}.{i}", (f"stage{s}.{i}",), b, _call)
                    for i, b in enumerate(getattr(self, f"stage{s}"))]
        return out + [remat.unit(self, "head", ("head",), self.head, _head)]

    def spike_inputs(self) -> list[tuple[nnx.Module, str]]:
        """The layers that consume spikes (``snnjax.models.remat``): convs and projections after a neuron
        (``binary``) or on the residual stream, a sum of spike tensors (``counts``)."""
        p1 = self.patch_embed1
        out = [(p1.conv2.conv, "binary"), (p1.conv3.conv, "binary"), (p1.shortcut.conv, "binary")]
        for p in (self.patch_embed2, self.patch_embed3):
            out += [(p.conv1.conv, "counts"), (p.conv2.conv, "binary"), (p.shortcut.conv, "counts")]
        for s in (1, 2, 3):
            for b in getattr(self, f"stage{s}"):
                a = b.attn
                first = a.qkv if isinstance(a, SpikingSelfAttention) else a.qk
                out += [(first.fc, "counts"), (a.proj.fc, "binary"), (b.mlp.fc1.fc, "counts"),
                        (b.mlp.fc2.fc, "binary")]
                if isinstance(a, SpikingSelfAttention):
                    out.append((a, "binary"))
        return out

    def __call__(self, x: jax.Array) -> jax.Array:
        return run_units(self.units(), x)


def _call(module: nnx.Module, x: jax.Array) -> jax.Array:
    return module(x)


def _first(T: int, embed: nnx.Module, x: jax.Array) -> jax.Array:
    """The first embedding on ``[T, N, H, W, C]``, or on a static image ``[N, H, W, C]`` repeated ``T`` times."""
    if x.ndim == 4:
        x = jnp.broadcast_to(x[None], (T,) + x.shape)
    elif x.ndim != 5:
        raise ValueError(f"expected [N, H, W, C] or [T, N, H, W, C] input, got shape {x.shape}")
    return embed(x)


def _head(head: nnx.Module, x: jax.Array) -> jax.Array:
    return head(jnp.mean(x, axis=(2, 3)))


def qkformer_10_384(T: int = 4, in_channels: int = 3, num_classes: int = 1000,
                    spiking_neuron: type[BaseNode] | str | None = None, **kwargs) -> QKFormer:
    """SpikingJelly's ``qkformer_10_384``: 384 dims, depths (1, 2, 7), 6 heads per stage; logits ``[T, N, classes]``."""
    return QKFormer(T=T, in_channels=in_channels, num_classes=num_classes, embed_dims=384, num_heads=(6, 6, 6),
                    depths=(1, 2, 7), spiking_neuron=spiking_neuron, **kwargs)


def _sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"in_channels": image_frame(data, "qkformer")[2], "num_classes": data.num_classes, "T": data.time_steps}


register("qkformer", QKFormer, _sizes, ("in_channels", "num_classes", "T"))

# SpikingJelly's qkformer keys.
_E = r"patch_embed(?P<s>[123])"
_B = r"stage(?P<s>[123])\.(?P<i>\d+)"
register_rules(QKFormer, [
    Rule(rf"{_E}\.conv(?P<j>[123])", "patch_embed{s}.conv{j}.conv", "conv"),
    Rule(rf"{_E}\.bn(?P<j>[123])", "patch_embed{s}.conv{j}.bn", "bn"),
    Rule(rf"{_E}\.lif(?P<j>[123])", "patch_embed{s}.lif{j}", "neuron"),
    Rule(rf"{_E}\.shortcut\.0", "patch_embed{s}.shortcut.conv", "conv"),
    Rule(rf"{_E}\.shortcut\.1", "patch_embed{s}.shortcut.bn", "bn"),
    Rule(rf"{_E}\.shortcut\.2", "patch_embed{s}.shortcut_lif", "neuron"),
    Rule(rf"{_B}\.attn\.(?P<p>qkv|qk|proj)_conv_bn\.0", "stage{s}.{i}.attn.{p}.fc", "linear"),
    Rule(rf"{_B}\.attn\.(?P<p>qkv|qk|proj)_conv_bn\.1", "stage{s}.{i}.attn.{p}.bn", "bn"),
    Rule(rf"{_B}\.attn\.(?P<n>qkv|qk|attn|proj)_lif", "stage{s}.{i}.attn.{n}_lif", "neuron"),
    Rule(rf"{_B}\.mlp\.fc(?P<j>[12])", "stage{s}.{i}.mlp.fc{j}.fc", "linear"),
    Rule(rf"{_B}\.mlp\.bn(?P<j>[12])", "stage{s}.{i}.mlp.fc{j}.bn", "bn"),
    Rule(rf"{_B}\.mlp\.lif(?P<j>[12])", "stage{s}.{i}.mlp.lif{j}", "neuron"),
    Rule(r"head", "head", "linear"),
])
