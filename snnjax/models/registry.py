"""Build a model by name from config-style keyword arguments, with errors that list the allowed keys."""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
from flax import nnx

from snnjax.models.mlp import SpikingMLP
from snnjax.models.spikformer import Spikformer
from snnjax.models.vgg import CIFAR10DVSVGG
from snnjax.neurons import surrogate as sg

MODELS: dict[str, Callable[..., nnx.Module]] = {
    "mlp": SpikingMLP,
    "cifar10dvs_vgg": CIFAR10DVSVGG,
    "spikformer": Spikformer,
}
_BUILT_BY_TRAINER = {"rngs", "dtype", "param_dtype"}
# Sizes the trainer takes from the dataset unless a config sets them.
FROM_DATA = ("in_features", "in_channels", "image_size", "img_size", "num_classes", "T")


def allowed_kwargs(name: str) -> list[str]:
    """The constructor arguments a config may set for model ``name``."""
    params = inspect.signature(MODELS[name].__init__).parameters
    return sorted(k for k in params if k not in _BUILT_BY_TRAINER and k != "self")


def model_config(name: str, **overrides: Any) -> ml_collections.ConfigDict:
    """Config of model ``name``: every constructor option with its default (surrogates by name), then ``overrides``.

    Sizes in ``FROM_DATA`` are left out (taken from the dataset) unless given in ``overrides``.
    """
    check_model_kwargs(name, overrides)
    params = inspect.signature(MODELS[name].__init__).parameters
    c = ml_collections.ConfigDict({"name": name})
    for key in allowed_kwargs(name):
        default = params[key].default
        if key in FROM_DATA or default is inspect.Parameter.empty:
            continue
        if key == "surrogate_function":
            default = sg.name_of(default)
        c[key] = default
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
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("surrogate_function"), str):
        kwargs["surrogate_function"] = sg.get(kwargs["surrogate_function"])
    for key in ("widths", "pools", "hidden"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    return MODELS[name](**kwargs, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
