"""Import SpikingJelly (PyTorch) weights into snnjax models.

A ``state_dict`` is any mapping from torch key to numpy array (``np.load`` of an
``.npz``, or ``{k: v.numpy() for k, v in torch.load(...).items()}``). Layouts are
converted on the way in: Conv2d ``[O, I, kh, kw] -> [kh, kw, I, O]``, Conv1d
``[O, I, 1] -> [I, O]``, Linear ``[out, in] -> [in, out]``, and the VGG
classifier's input axis from torch's ``[C, H, W]`` flatten order to our ``[H, W, C]``, and
Spikformer's attention split by head: the fused q/k/v kernel ``[D, 3D] -> [D, 3, heads, head_dim]``
(its BatchNorm ``[3D] -> [3, heads, head_dim]``), the output projection ``[D, D] -> [heads, head_dim, D]``.
Every conversion is a permutation, so the same function maps torch gradients.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax.interop import rules
from snnjax.models import CIFAR10DVSVGG, MSResNet, Spikformer
from snnjax.models.plif_net import ParametricLIFNet
from snnjax.models.resnet import ResNet

Path = tuple
Convert = Callable[[np.ndarray], np.ndarray]

_BN_NAMES = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var"}


def _weight(arr: np.ndarray) -> np.ndarray:
    if arr.ndim == 4:  # Conv2d OIHW -> HWIO
        return arr.transpose(2, 3, 1, 0)
    if arr.ndim == 3:  # Conv1d(k=1) OI1 -> IO
        return arr[:, :, 0].T
    return arr.T  # Linear [out, in] -> [in, out]


def _identity(arr):
    return arr


def _layer(prefix: Path, name: str, is_bn: bool) -> tuple[Path, Convert] | None:
    """Path and converter of one conv/linear (``is_bn=False``) or BatchNorm parameter."""
    if is_bn:
        if name == "num_batches_tracked":
            return None
        return prefix + (_BN_NAMES[name],), _identity
    return prefix + ("kernel" if name == "weight" else "bias",), _weight if name == "weight" else _identity


def _vgg_rule(model: CIFAR10DVSVGG, key: str):
    if m := re.fullmatch(r"features\.(\d+)\.proj_bn\.(\d+)\.(\w+)", key):
        i, j, name = int(m[1]), int(m[2]), m[3]
        block = model.features[i]
        conv_index = 1 if block.pool else 0
        if j not in (conv_index, conv_index + 1):
            raise KeyError(key)
        is_bn = j == conv_index + 1
        return _layer(("features", i, "bn" if is_bn else "conv"), name, is_bn)
    if m := re.fullmatch(r"classifier\.(\d+)\.(weight|bias)", key):
        if m[2] == "bias":
            return ("classifier", "bias"), _identity
        h, w, c = model.feature_shape

        def classifier_weight(arr):  # [out, C*H*W] (torch order) -> [H*W*C, out]
            if arr.ndim != 2 or arr.shape[1] != h * w * c:
                raise ValueError(f"shape mismatch at classifier.kernel: the model's features flatten to "
                                 f"{c}x{h}x{w}={h * w * c}, the state_dict's classifier takes {arr.shape[1:]}")
            return arr.reshape(arr.shape[0], c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, arr.shape[0])

        return ("classifier", "kernel"), classifier_weight
    raise KeyError(key)


_SPIKFORMER_PARTS = [
    (r"patch_embed\.stages\.(\d+)\.conv_bn\.block\.([01])\.(\w+)", lambda g: ("stages", int(g[0])), ("conv", "bn")),
    (r"patch_embed\.positional_encoding\.conv_bn\.block\.([01])\.(\w+)", lambda g: ("positional_encoding",),
     ("conv", "bn")),
    (r"blocks\.(\d+)\.attn\.(qkv|proj)_conv_bn\.([01])\.(\w+)", lambda g: ("blocks", int(g[0]), "attn", g[1]),
     ("fc", "bn")),
    (r"blocks\.(\d+)\.mlp\.(fc1|fc2)\.([01])\.(\w+)", lambda g: ("blocks", int(g[0]), "mlp", g[1]), ("fc", "bn")),
]


def _by_head(convert: Convert, shape: tuple[int, ...], path: Path) -> Convert:
    """``convert`` then reshape the flat channel dim(s) to the head-split ``shape`` of the model's variable."""

    def f(arr):
        out = convert(arr)
        if out.size != int(np.prod(shape)):
            raise ValueError(f"shape mismatch at {'.'.join(map(str, path))}: model {shape}, state_dict gives "
                             f"{out.shape} after layout conversion")
        return out.reshape(shape)

    return f


def _spikformer_rule(model: Spikformer, key: str):
    for pattern, prefix, (layer_name, bn_name) in _SPIKFORMER_PARTS:
        if m := re.fullmatch(pattern, key):
            groups = m.groups()
            is_bn = groups[-2] == "1"
            target = _layer(prefix(groups) + (bn_name if is_bn else layer_name,), groups[-1], is_bn)
            if target is not None and "attn" in target[0]:  # head-split layouts
                path, convert = target
                attn = model.blocks[path[1]].attn
                heads, dim = attn.num_heads, attn.proj.bn.num_features
                shape = {("qkv", "fc"): (dim, 3, heads, dim // heads), ("qkv", "bn"): (3, heads, dim // heads),
                         ("proj", "fc"): (heads, dim // heads, dim)}.get(path[3:5])
                if shape is not None:
                    target = path, _by_head(convert, shape, path)
            return target
    if m := re.fullmatch(r"head\.(weight|bias)", key):
        return _layer(("head",), m[1], False)
    raise KeyError(key)


def key_rule(model: nnx.Module) -> Callable[[str], tuple[Path, Convert] | None]:
    """The torch-key -> (snnjax path, converter) mapping for ``model`` (None: key carries nothing to import)."""
    if isinstance(model, CIFAR10DVSVGG):
        return lambda key: _vgg_rule(model, key)
    if isinstance(model, Spikformer):
        return lambda key: _spikformer_rule(model, key)
    if isinstance(model, ResNet):  # SpikingJelly's SpikingResNet / SEWResNet
        return lambda key: rules.lookup(rules.RESNET, key)
    if isinstance(model, MSResNet):  # MSResNet, MaxResNet
        return lambda key: rules.lookup(rules.MS_RESNET, key)
    if isinstance(model, ParametricLIFNet):  # DVSGestureNet, CIFAR10DVSNet, NMNISTNet
        table = rules.parametric_lif_net(len(model.features))
        return lambda key: rules.lookup(table, key, model.feature_shape)
    raise TypeError(f"no SpikingJelly mapping for {type(model).__name__}; supported: CIFAR10DVSVGG, Spikformer, "
                    "ResNet (SpikingResNet, SEWResNet), MSResNet (MSResNet, MaxResNet), ParametricLIFNet "
                    "(DVSGestureNet, CIFAR10DVSNet, NMNISTNet)")


def convert_state_dict(model: nnx.Module, state_dict: Mapping[str, np.ndarray]) -> dict[Path, np.ndarray]:
    """Torch-keyed arrays -> ``{snnjax path: array in snnjax layout}`` (unknown keys raise KeyError)."""
    rule, out = key_rule(model), {}
    for key, arr in state_dict.items():
        try:
            target = rule(key)
        except (KeyError, IndexError):
            raise KeyError(f"SpikingJelly key {key!r} has no counterpart in {type(model).__name__}; "
                           "is this checkpoint for a different architecture or width?") from None
        if target is not None:
            path, convert = target
            out[path] = convert(np.asarray(arr))
    return out


def import_state_dict(model: nnx.Module, state_dict: Mapping[str, np.ndarray], *, dtype=None) -> None:
    """Load a SpikingJelly ``state_dict`` into ``model`` in place (parameters and BatchNorm statistics).

    Every parameter and statistic of ``model`` must be provided, with matching shapes.
    Values are cast to each variable's current dtype unless ``dtype`` is given; a float64 state_dict cast to
    float32 warns (pass ``dtype=jnp.float64`` with ``jax_enable_x64``, or build the model with ``param_dtype``).
    """
    converted = convert_state_dict(model, state_dict)
    flat = dict(nnx.to_flat_state(nnx.state(model, (nnx.Param, nnx.BatchStat))))
    missing = sorted(".".join(map(str, p)) for p in flat if p not in converted)
    if missing:
        raise KeyError(f"the state_dict does not provide {len(missing)} of the model's variables, e.g. {missing[:5]}")
    narrowed: list = []
    for path, value in converted.items():
        if path not in flat:
            raise KeyError(f"snnjax path {path} derived from the state_dict does not exist in the model")
        var = flat[path]
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(f"shape mismatch at {'.'.join(map(str, path))}: model {tuple(var.shape)}, "
                             f"state_dict gives {tuple(value.shape)} after layout conversion")
        target = np.dtype(dtype or var.get_value().dtype)
        if dtype is None and value.dtype == np.float64 and target == np.float32 and not narrowed:
            narrowed.append(path)
            warnings.warn(f"the state_dict is float64 and {type(model).__name__}'s variables are float32: importing "
                          "rounds them (outputs then differ from SpikingJelly's float64 ones by ~1e-7); pass "
                          "dtype=jnp.float64 (with jax_enable_x64) to keep float64", stacklevel=2)
        var.set_value(jnp.asarray(value, target))

