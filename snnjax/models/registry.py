"""Model registry: build a model by name from config-style keyword arguments, its sizes read from the data.

Each entry names the model's constructor and how its input/output sizes follow from the data
(:class:`DataShape`), so the trainer needs no per-model code: adding a model is one entry here.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
from flax import nnx

from snnjax.models.mlp import SpikingMLP
from snnjax.models.ms_resnet import MaxResNet, MSResNet
from snnjax.models.plif_net import PRESETS as PLIF_PRESETS
from snnjax.models.plif_net import ParametricLIFNet
from snnjax.models.qkformer import QKFormer
from snnjax.models.resnet import ResNet
from snnjax.models.sdt import SpikeDrivenTransformer
from snnjax.models.spikformer import Spikformer
from snnjax.models.vgg import CIFAR10DVSVGG, DEFAULT_POOLS
from snnjax.neurons import IMPLS, set_impl
from snnjax.neurons import surrogate as sg


@dataclasses.dataclass(frozen=True)
class DataShape:
    """What the data says about a model's sizes.

    Attributes:
      frame_shape: one example at one time step, ``(H, W, C)`` (images and event frames alike).
      num_classes: number of classes.
      time_steps: ``T``, the time steps the model sees.
    """

    frame_shape: tuple[int, ...]
    num_classes: int
    time_steps: int

    @classmethod
    def of(cls, source: Any, time_steps: int) -> DataShape:
        """The shape of ``source`` (a :class:`snnjax.data.Source`: ``example_shape``, ``num_classes``, ``time_steps``).

        ``time_steps`` is the ``T`` the encoder gives static images; event sources carry their own.
        """
        event_steps = getattr(source, "time_steps", None)
        shape = tuple(source.example_shape)
        if event_steps is not None:  # event frames [T, H, W, C]: their own time axis
            return cls(shape[1:], int(source.num_classes), int(event_steps))
        return cls(shape, int(source.num_classes), int(time_steps))


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered model: its constructor, and its size keywords as a function of the data and its options."""

    build: Callable[..., nnx.Module]
    sizes: Callable[[DataShape, Mapping[str, Any]], dict[str, Any]]
    size_keys: tuple[str, ...]  # the keywords ``sizes`` returns (left out of model_config)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the preset's constructor keywords


def _image(data: DataShape, model: str) -> tuple[int, int, int]:
    if len(data.frame_shape) != 3:
        raise ValueError(f"model {model!r} takes image frames [H, W, C]; the data gives examples of shape "
                         f"{data.frame_shape} per time step: choose a model such as 'mlp' or image data")
    h, w, c = data.frame_shape
    return h, w, c


def _mlp_sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"in_features": math.prod(data.frame_shape), "num_classes": data.num_classes}


def _vgg_sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = _image(data, "cifar10dvs_vgg")
    if h != w:
        raise ValueError(f"model 'cifar10dvs_vgg' takes square frames (one image_size); the data gives {h}x{w}: "
                         "resize it (e.g. --config.data.options.size=48) or choose another model")
    min_size = 2 ** (sum(map(bool, options.get("pools", DEFAULT_POOLS))) + 1)  # each pool and the final one halve
    if h < min_size:
        raise ValueError(f"model 'cifar10dvs_vgg' pools its frames down by {min_size}; the data gives {h}x{w}: "
                         f"choose data with frames of at least {min_size}x{min_size}, fewer model.pools, or "
                         "another model")
    return {"in_channels": c, "image_size": h, "num_classes": data.num_classes}


def _spikformer_sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = _image(data, "spikformer")
    return {"in_channels": c, "img_size": (h, w), "num_classes": data.num_classes, "T": data.time_steps}


def _transformer_sizes(name: str):
    def sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
        return {"in_channels": _image(data, name)[2], "num_classes": data.num_classes, "T": data.time_steps}
    return sizes


def _resnet_sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = _image(data, "resnet")
    return {"in_channels": c, "num_classes": data.num_classes}


def _ms_resnet_sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"in_channels": _image(data, "ms_resnet")[2], "num_classes": data.num_classes, "T": data.time_steps}


def _plif_sizes(data: DataShape, options: Mapping[str, Any]) -> dict[str, Any]:
    h, w, c = _image(data, "parametric-LIF net")
    stages = options.get("stages", 5)
    if h != w or h < 2 ** stages:
        raise ValueError(f"the parametric-LIF nets take square frames of at least {2 ** stages}x{2 ** stages} "
                         f"(model.stages={stages} poolings); the data gives {h}x{w}: resize it (e.g. "
                         "--config.data.options.size=128) or lower model.stages")
    return {"in_channels": c, "image_size": h, "num_classes": data.num_classes}


_RESNET_SIZES = ("in_channels", "num_classes")
_PLIF_SIZES = ("in_channels", "image_size", "num_classes")
_MS_RESNET_SIZES = ("in_channels", "num_classes", "T")

REGISTRY: dict[str, ModelEntry] = {
    "mlp": ModelEntry(SpikingMLP, _mlp_sizes, ("in_features", "num_classes")),
    "cifar10dvs_vgg": ModelEntry(CIFAR10DVSVGG, _vgg_sizes, ("in_channels", "image_size", "num_classes")),
    "spikformer": ModelEntry(Spikformer, _spikformer_sizes, ("in_channels", "img_size", "num_classes", "T")),
    "sdt": ModelEntry(SpikeDrivenTransformer, _transformer_sizes("sdt"), ("in_channels", "num_classes", "T")),
    "qkformer": ModelEntry(QKFormer, _transformer_sizes("qkformer"), ("in_channels", "num_classes", "T")),
    **{f"spiking_resnet{d}": ModelEntry(ResNet, _resnet_sizes, _RESNET_SIZES, {"depth": d, "cnf": None})
       for d in (18, 34, 50)},
    **{f"sew_resnet{d}": ModelEntry(ResNet, _resnet_sizes, _RESNET_SIZES, {"depth": d, "cnf": "ADD"})
       for d in (18, 34, 50)},
    "ms_resnet18": ModelEntry(MSResNet, _ms_resnet_sizes, _MS_RESNET_SIZES, {"stage_blocks": (2, 2, 2, 2)}),
    "ms_resnet34": ModelEntry(MSResNet, _ms_resnet_sizes, _MS_RESNET_SIZES, {"stage_blocks": (3, 4, 6, 3)}),
    "max_resnet18": ModelEntry(MaxResNet, _ms_resnet_sizes, _MS_RESNET_SIZES,
                               {"stage_blocks": (3, 3, 2), "stage_channels": (128, 256, 512), "stem_kernel_size": 3,
                                "stem_stride": 1}),
    **{f"{name}_net": ModelEntry(ParametricLIFNet, _plif_sizes, _PLIF_SIZES, preset)
       for name, preset in PLIF_PRESETS.items()},
}
MODELS: dict[str, Callable[..., nnx.Module]] = {name: entry.build for name, entry in REGISTRY.items()}
_BUILT_BY_TRAINER = {"rngs", "dtype", "param_dtype"}
# Options every model takes besides its constructor's: the multi-step neurons' implementation
# (``snnjax.neurons.kernels.dispatch``; set on the built model's neurons).
COMMON_OPTIONS = {"neuron_impl": "auto"}
TUPLE_KEYS = ("widths", "pools", "hidden", "stage_blocks", "stage_channels")  # sequences (tuples in the config)
# Options whose None default means "not given" (MS-ResNet's neuron keywords, resolved as SpikingJelly does), by
# type: the config holds a typed placeholder so that the command line can set them.
UNSET_TYPES = {"spiking_neuron": str, "tau": float, "decay_input": bool, "v_threshold": float,
               "surrogate_function": str, "detach_reset": bool, **{k: tuple for k in TUPLE_KEYS}}


def sizes_from_data(name: str, data: DataShape, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Model ``name``'s size keywords (``in_features``, ``num_classes``, ...) for ``data``.

    ``options`` are the other constructor keywords the model will get (some sizes depend on them).

    Raises:
      ValueError: unknown model or option, or data the model cannot take (the message says what to change).
    """
    options = {**REGISTRY[name].defaults, **(options or {})} if name in REGISTRY else dict(options or {})
    check_model_kwargs(name, options)
    return REGISTRY[name].sizes(data, options)


def allowed_kwargs(name: str) -> list[str]:
    """The constructor arguments a config may set for model ``name``."""
    params = inspect.signature(MODELS[name].__init__).parameters
    return sorted([k for k in params if k not in _BUILT_BY_TRAINER and k != "self"] + list(COMMON_OPTIONS))


def model_config(name: str, **overrides: Any) -> ml_collections.ConfigDict:
    """Config of model ``name``: every constructor option with its default (surrogates by name), then ``overrides``.

    The sizes the data gives (the entry's ``size_keys``) are left out unless given in ``overrides``.
    """
    check_model_kwargs(name, overrides)
    params = inspect.signature(MODELS[name].__init__).parameters
    c = ml_collections.ConfigDict({"name": name})
    for key in allowed_kwargs(name):
        if key in COMMON_OPTIONS:
            c[key] = COMMON_OPTIONS[key]
            continue
        default = params[key].default
        if key in REGISTRY[name].size_keys or default is inspect.Parameter.empty:
            continue
        if key == "surrogate_function" and default is not None:
            default = sg.name_of(default)
        default = REGISTRY[name].defaults.get(key, default)
        # An option left unset (None) stays overridable from the command line, with its type.
        c[key] = ml_collections.config_dict.placeholder(UNSET_TYPES[key]) if default is None and key in UNSET_TYPES \
            else default
    for key, value in overrides.items():
        c[key] = value
    return c


def check_model_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the model, the bad keys and the allowed ones."""
    if name not in MODELS:
        raise ValueError(f"model.name={name!r} is not a model; choose one of {sorted(MODELS)}")
    allowed = allowed_kwargs(name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"model {name!r} has no option(s) {unknown}; allowed: {allowed}")


def create_model(name: str, kwargs: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=None) -> nnx.Module:
    """``MODELS[name](**kwargs)``; ``surrogate_function`` may be given by name (e.g. ``"atan"``)."""
    check_model_kwargs(name, kwargs)
    kwargs = {**REGISTRY[name].defaults, **kwargs}
    impl = kwargs.pop("neuron_impl", COMMON_OPTIONS["neuron_impl"])
    if impl not in IMPLS:
        raise ValueError(f"model.neuron_impl={impl!r} is not a neuron implementation; choose one of {list(IMPLS)}")
    if isinstance(kwargs.get("surrogate_function"), str):
        kwargs["surrogate_function"] = sg.get(kwargs["surrogate_function"])
    for key in TUPLE_KEYS:
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = tuple(kwargs[key])
    model = MODELS[name](**kwargs, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    set_impl(model, impl)
    return model
