"""Import a SpikingJelly (PyTorch) ``state_dict``: the converters, per-layer rules and importer every model uses.

A torch key is ``<module prefix>.<tensor name>``. A *locator* gives each key's snnjax module path and
``LayerRule``: which of the module's variables each torch tensor goes to, and how its layout changes on
the way (``OIHW -> HWIO`` for convolutions, ``[out, in] -> [in, out]`` for linear layers). ``convert``
applies it to a whole ``state_dict`` and reports every key; ``assign`` loads the result. The zoo models
locate keys through their family's rule table (declared in the model file, applied by ``snnjax.interop.rules``);
any other model built from snnjax's layers and neurons through ``layer_locator``, which pairs each snnjax module
with the torch module of the same name and takes the ``LayerRule`` of the module's type from ``RULES``.
``snnjax.Sequential`` pairs layer ``i`` with torch prefix ``i`` (``nn.Sequential``'s keys); other models pair each
module's attribute path (``features.3.conv`` with ``features.3.conv.`` keys) unless ``prefixes`` says otherwise.
Both import with ``snnjax.interop.spikingjelly.import_state_dict``:

    sd = dict(np.load("net_state_dict.npz"))                # torch keys -> numpy arrays
    report = import_state_dict(net, sd, dtype=jnp.float64)  # float64 needs jax_enable_x64
    print(report)                                            # each key -> variable, leftovers, casts

The state_dict is plain numpy (produce it where torch lives, e.g. ``np.savez(path, **{k: v.numpy()
for k, v in net.state_dict().items()})``); nothing here imports torch. SpikingJelly's inputs are
``[N, T, C, H, W]`` (or ``[T, N, C, H, W]`` in multi-step mode); snnjax's are ``[T, N, H, W, C]``:
``x.transpose(1, 0, 3, 4, 2)`` from the first, ``x.transpose(0, 1, 3, 4, 2)`` from the second.
Neuron settings (``tau``, ``v_threshold``, ...) are not in a state_dict: build the snnjax neurons
with SpikingJelly's values. Compare outputs with both sides in eval mode (``model.eval()`` and
``net.eval()``), or both in train mode.

Extending: a new layer type maps with one entry, ``RULES[MyLayer] = LayerRule({"weight": ("kernel",
oihw_to_hwio)})``; a model whose torch names differ from its attribute paths passes ``prefixes``
(torch prefix -> module path), and a layer that needs its own conversion passes ``rules`` (torch prefix ->
``LayerRule``).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snnjax.layers import AdaptiveAvgPool2d, AvgPool2d, BatchNorm, Flatten, MaxPool2d, Scale, WSConv2d, WSLinear
from snnjax.models.sequential import Sequential
from snnjax.neurons.modules import BaseNode
from snnjax.neurons.psn import PSN, MaskedPSN, PSNLambda, SlidingPSN

Convert = Callable[[np.ndarray], np.ndarray]
Path = tuple


def identity(arr: np.ndarray) -> np.ndarray:
    return arr


def oihw_to_hwio(arr: np.ndarray) -> np.ndarray:
    """A torch ``Conv2d`` kernel ``[O, I, kh, kw]`` -> ``[kh, kw, I, O]``."""
    if arr.ndim != 4:
        raise ValueError(f"a Conv2d weight is [O, I, kh, kw]; got shape {arr.shape}")
    return arr.transpose(2, 3, 1, 0)


def out_in_to_in_out(arr: np.ndarray) -> np.ndarray:
    """A torch ``Linear`` weight ``[out, in]`` -> ``[in, out]`` (a ``Conv1d`` ``[O, I, 1]`` or 1x1 ``Conv2d``
    ``[O, I, 1, 1]`` acting on tokens, too)."""
    if arr.ndim < 2 or arr.shape[2:] != (1,) * (arr.ndim - 2):
        raise ValueError(f"a Linear weight is [out, in]; got shape {arr.shape}")
    return arr.reshape(arr.shape[:2]).T


def flat_linear_weight(feature_shape: tuple[int, int, int]) -> Convert:
    """``[out, C*H*W]`` (torch's flatten order) -> ``[H*W*C, out]`` for features ``feature_shape = (H, W, C)``."""
    h, w, c = feature_shape

    def convert(arr):
        if arr.ndim != 2 or arr.shape[1] != h * w * c:
            raise ValueError(f"the model's features flatten to {c}x{h}x{w}={h * w * c}, the state_dict's layer "
                             f"takes {arr.shape[1:]}")
        return arr.reshape(arr.shape[0], c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, arr.shape[0])

    return convert


@dataclasses.dataclass(frozen=True)
class LayerRule:
    """One layer type's torch tensors: ``tensors`` maps a torch name (``weight``) to the snnjax variable's
    attribute and the layout conversion (``("kernel", oihw_to_hwio)``); ``ignore`` lists torch names that carry
    nothing snnjax keeps (BatchNorm's ``num_batches_tracked``)."""

    tensors: Mapping[str, tuple[str, Convert]] = dataclasses.field(default_factory=dict)
    ignore: tuple[str, ...] = ()


CONV = LayerRule({"weight": ("kernel", oihw_to_hwio), "bias": ("bias", identity)})
LINEAR = LayerRule({"weight": ("kernel", out_in_to_in_out), "bias": ("bias", identity)})
BATCHNORM = LayerRule({"weight": ("scale", identity), "bias": ("bias", identity),
                       "running_mean": ("mean", identity), "running_var": ("var", identity)},
                      ignore=("num_batches_tracked",))
PSN_RULE = LayerRule({"weight": ("weight", identity), "bias": ("bias", identity)})
MASKED_PSN = LayerRule({"weight": ("weight", identity), "bias": ("bias", identity), "_lambda_": ("lambda_", identity)},
                       ignore=("mask0", "mask1"))  # the masks follow from k and T
NOTHING = LayerRule()


def flat_gain(arr: np.ndarray) -> np.ndarray:
    """A weight-standardised layer's gain ``[O, 1, 1, 1]`` (conv) or ``[out, 1]`` (linear) -> ``[O]``."""
    return arr.reshape(arr.shape[0])


WS_CONV = LayerRule({**CONV.tensors, "gain": ("gain", flat_gain)})
WS_LINEAR = LayerRule({**LINEAR.tensors, "gain": ("gain", flat_gain)})

# The variable types a state_dict fills: parameters, BatchNorm statistics, MaskedPSN's lambda_ (a buffer there).
IMPORTED = (nnx.Param, nnx.BatchStat, PSNLambda)
# Module type -> rule. Looked up along the module's class hierarchy (snnjax's Conv2d is an nnx.Conv).
RULES: dict[type, LayerRule] = {
    WSConv2d: WS_CONV, WSLinear: WS_LINEAR, nnx.Conv: CONV, nnx.Linear: LINEAR, BatchNorm: BATCHNORM,
    MaxPool2d: NOTHING, AvgPool2d: NOTHING, AdaptiveAvgPool2d: NOTHING, Scale: NOTHING, Flatten: NOTHING,
    nnx.Dropout: NOTHING, PSN: PSN_RULE, SlidingPSN: PSN_RULE, MaskedPSN: MASKED_PSN,
}


def rule_for(module: nnx.Module) -> LayerRule | None:
    """The rule of ``module``'s type (or its nearest base class in ``RULES``); None for containers. A neuron's
    tensors are its learned parameters under their SpikingJelly names (PLIF's ``w``, KLIF's ``k``, ...)."""
    if isinstance(module, BaseNode):
        return LayerRule({name: (name, identity) for name in module.param_names()})
    for cls in type(module).__mro__:
        if cls in RULES:
            return RULES[cls]
    return None


@dataclasses.dataclass
class Imported:
    key: str
    path: str
    torch_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    note: str = ""


@dataclasses.dataclass
class ImportReport:
    """What an import did: every key imported (to which variable, shapes, dtype), the keys ignored by
    rule, the keys left over (no counterpart), the model's variables not provided, and dtype casts."""

    imported: list[Imported]
    ignored: list[str]
    leftover: list[str]
    missing: list[str]

    def __str__(self) -> str:
        w = max([len(i.key) for i in self.imported] + [10])
        lines = [f"{len(self.imported)} tensors imported, {len(self.ignored)} ignored, {len(self.leftover)} left over, "
                 f"{len(self.missing)} model variables not provided"]
        for i in self.imported:
            shapes = f"{i.torch_shape} -> {i.shape}" if i.torch_shape != i.shape else str(i.shape)
            lines.append(f"  {i.key:<{w}} -> {i.path:<28} {shapes:<30} {i.dtype}" + (f"  ({i.note})" if i.note else ""))
        for name, keys in (("ignored", self.ignored), ("left over", self.leftover), ("not provided", self.missing)):
            if keys:
                lines.append(f"  {name}: {', '.join(keys)}")
        return "\n".join(lines)


Locate = Callable[[str], "tuple[Path, LayerRule] | None"]


def convert(model: nnx.Module, state_dict: Mapping[str, Any], locate: Locate, *, allow_unused: bool = False,
            dtype=None) -> tuple[dict[Path, np.ndarray], ImportReport]:
    """Torch-keyed arrays -> ``({snnjax variable path: array in snnjax layout}, report)``; ``model`` is unchanged.

    ``locate(key)``: the snnjax module path and ``LayerRule`` of a torch key, or None (the key is left over, as
    is one whose tensor name its rule lacks). ``allow_unused``: report left-over keys instead of refusing them.
    A flat channel axis is split into the variable's head axes (``[3D] -> [3, heads, head_dim]``: torch's channel
    order is head-major). ``dtype``: the dtype the report notes casts to (default: each variable's own).

    Raises:
      KeyError: left-over keys (without ``allow_unused``), or a key that lands on no variable of ``model``
        (another depth or neuron).
      ValueError: a key whose array does not fit its variable (another width); ``dtype`` float64 without x64.
    """
    if dtype is not None and np.dtype(dtype).itemsize == 8 and not jax.config.read("jax_enable_x64"):
        raise ValueError(f"importing with dtype={np.dtype(dtype).name} needs jax_enable_x64: call "
                         "jax.config.update('jax_enable_x64', True) before building the model (or in a notebook's "
                         "first cell)")
    name = type(model).__name__
    variables = {_dotted(p): (p, v) for p, v in nnx.to_flat_state(nnx.state(model, IMPORTED))}
    out, imported, ignored, leftover, located = {}, [], [], [], []
    for key, arr in state_dict.items():
        module, rule = locate(key) or ((), NOTHING)
        tensor = key.rpartition(".")[2]
        if tensor in rule.ignore:
            ignored.append(key)
        elif tensor not in rule.tensors:
            leftover.append(key)
        else:
            located.append((key, arr, module, rule.tensors[tensor]))
    if leftover and not allow_unused:
        raise KeyError(f"{len(leftover)} keys of the state_dict have no counterpart in {name}, e.g. {leftover[:5]}: "
                       "is this checkpoint for a different architecture or width? (allow_unused=True imports the "
                       "rest)")
    for key, arr, module, (attr, to_snnjax) in located:
        dotted = _dotted(module + (attr,))
        if dotted not in variables:
            raise KeyError(f"SpikingJelly key {key!r} maps to {dotted!r}, which does not exist in the model: this "
                           f"{name} does not have that layer (the checkpoint has more blocks or layers, or a "
                           "parametric neuron's w: build the model with the checkpoint's depth and neuron)")
        path, var = variables[dotted]
        arr = np.asarray(arr)
        try:
            value = to_snnjax(arr)
        except ValueError as e:
            raise ValueError(f"shape mismatch at {key}: {e}") from None
        shape = tuple(var.shape)
        if value.shape != shape and (value.ndim >= len(shape) or value.size != math.prod(shape)):
            raise ValueError(f"shape mismatch at {key}: shape {arr.shape} becomes {value.shape} in snnjax's layout, "
                             f"but this {name}'s {dotted} is {shape}: the checkpoint has another width; build the "
                             "model with its sizes (e.g. the zoo's widths, channels, embed_dims, num_heads, "
                             "mlp_ratio: config model.<name>, or the model's argument of that name)")
        out[path] = value.reshape(shape)
        target = np.dtype(dtype or var.get_value().dtype)
        note = (f"cast {value.dtype} -> {target.name}; pass dtype=jnp.{value.dtype} to keep it"
                if value.dtype.kind == "f" and np.finfo(target).bits < np.finfo(value.dtype).bits else "")
        imported.append(Imported(key, dotted, tuple(arr.shape), shape, target.name, note))
    missing = [d for d, (p, _) in variables.items() if p not in out]
    return out, ImportReport(imported, ignored, leftover, missing)


def assign(model: nnx.Module, values: Mapping[Path, np.ndarray], dtype=None) -> None:
    """Set ``model``'s variables at ``values``' paths in place, cast to ``dtype`` (default: each one's own)."""
    for path, var in nnx.to_flat_state(nnx.state(model, IMPORTED)):
        if path in values:
            var.set_value(jnp.asarray(values[path], dtype or var.get_value().dtype))


def default_prefixes(model: nnx.Module) -> dict[str, Path]:
    """``{torch key prefix: snnjax module path}`` for every module with a rule: its attribute path dotted, with
    a ``Sequential``'s ``layers`` left out (``nn.Sequential`` keys are ``0.weight``, not ``layers.0.weight``)."""
    sequential_lists = {path + ("layers",) for path, m in nnx.iter_modules(model) if isinstance(m, Sequential)}
    out = {}
    for path, module in nnx.iter_modules(model):
        if rule_for(module) is None:
            continue
        torch_path = [str(p) for i, p in enumerate(path) if tuple(path[:i + 1]) not in sequential_lists]
        out[".".join(torch_path)] = tuple(path)
    return out


def layer_locator(model: nnx.Module, prefixes: Mapping[str, Path] | None = None,
                  rules: Mapping[str, LayerRule] | None = None) -> Locate:
    """``key -> (module path, LayerRule)`` layer by layer: the module at the key's prefix (``prefixes``: ``{torch
    prefix: snnjax module path}``, default ``default_prefixes(model)``) and the ``LayerRule`` of its type (``RULES``),
    or ``rules[prefix]`` where given (e.g. a classifier after a channels-first flatten permutes its input axis)."""
    prefixes = default_prefixes(model) if prefixes is None else dict(prefixes)
    modules = dict(nnx.iter_modules(model))

    def locate(key: str) -> tuple[Path, LayerRule] | None:
        prefix = key.rpartition(".")[0]
        if prefix not in prefixes:
            return None
        path = tuple(prefixes[prefix])
        if path not in modules:
            raise KeyError(f"prefixes[{prefix!r}] = {path}: the model has no module at that path")
        return path, (rules or {}).get(prefix) or rule_for(modules[path]) or NOTHING

    return locate


def _dotted(path: Path) -> str:
    return ".".join(map(str, path))


def spikingjelly_inputs(x: np.ndarray | jax.Array, *, batch_first: bool = True) -> jax.Array:
    """SpikingJelly's ``[N, T, C, H, W]`` (``batch_first``) or ``[T, N, C, H, W]`` -> snnjax's ``[T, N, H, W, C]``."""
    if np.ndim(x) != 5:
        raise ValueError(f"spikingjelly_inputs expects a 5-D [N, T, C, H, W] or [T, N, C, H, W] array, got shape "
                         f"{np.shape(x)}")
    return jnp.asarray(x).transpose((1, 0, 3, 4, 2) if batch_first else (0, 1, 3, 4, 2))
