"""Dataset registry: ``get_source(name, split, data_dir=..., **options)``.

=================  =========================  ==============================================
name               inputs per example         data / options
=================  =========================  ==============================================
``digits``         ``[8, 8, 1]`` in [0, 1]    sklearn, no download; ``test_fraction``, ``seed``
``mnist``          ``[28, 28, 1]`` in [0, 1]  TFDS ``array_record`` in ``data_dir``
``fashion_mnist``  ``[28, 28, 1]`` in [0, 1]  TFDS ``array_record`` in ``data_dir``
``cifar10``        ``[32, 32, 3]`` in [0, 1]  TFDS ``array_record`` in ``data_dir``
``nmnist``         ``[T, 34, 34, 2]`` counts  ``data_dir/{Train,Test}/<digit>/*.bin``;
                                              ``time_steps``, ``cache_dir``, ``cache``
``cifar10dvs``     ``[T, h, w, 2]`` counts    ``data_dir/<class>/*.aedat``; ``time_steps``,
                                              ``size``, ``train_ratio``, ``cache_dir``, ``cache``
``synthetic_dvs``  ``[T, 48, 48, 2]`` counts  generated; ``num_examples``, ``time_steps``,
                                              ``size``, ``num_classes``, ``seed``, ...
=================  =========================  ==============================================
"""
from __future__ import annotations

import os
from typing import Any, Callable

from snnjax.data.cifar10dvs import cifar10dvs_source
from snnjax.data.digits import digits_source
from snnjax.data.nmnist import nmnist_source
from snnjax.data.source import Source
from snnjax.data.synthetic import SyntheticDVSSource
from snnjax.data.tfds_images import TfdsImageSource


def _no_data_dir(name: str, factory: Callable[..., Source]) -> Callable[..., Source]:
    def make(split: str, data_dir: str | os.PathLike | None, **options: Any) -> Source:
        if data_dir is not None:
            raise ValueError(f"{name} reads no files; do not pass data_dir")
        return factory(split, **options)
    return make


def _tfds(name: str) -> Callable[..., Source]:
    def make(split: str, data_dir: str | os.PathLike | None, **options: Any) -> Source:
        return TfdsImageSource(name, split, data_dir, **options)
    return make


def _event(factory: Callable[..., Source]) -> Callable[..., Source]:
    def make(split: str, data_dir: str | os.PathLike | None, **options: Any) -> Source:
        return factory(split, data_dir=data_dir, **options)
    return make


_REGISTRY: dict[str, Callable[..., Source]] = {
    "digits": _no_data_dir("digits", digits_source),
    "mnist": _tfds("mnist"),
    "fashion_mnist": _tfds("fashion_mnist"),
    "cifar10": _tfds("cifar10"),
    "nmnist": _event(nmnist_source),
    "cifar10dvs": _event(cifar10dvs_source),
    "synthetic_dvs": _no_data_dir("synthetic_dvs", SyntheticDVSSource),
}

SOURCE_NAMES = tuple(_REGISTRY)


def get_source(name: str, split: str, *, data_dir: str | os.PathLike | None = None,
               **options: Any) -> Source:
    """The dataset ``name``'s ``split`` as a :class:`Source`.

    Raises:
      ValueError: unknown ``name`` (the message lists :data:`SOURCE_NAMES`) or split.
      FileNotFoundError: the dataset's files are not in ``data_dir``.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(SOURCE_NAMES)}")
    return _REGISTRY[name](split, data_dir, **options)
