"""Dataset registry: ``get_source(name, split, data_dir=..., time_steps=..., **options)``.

=================  =========================  ==============================================
name               inputs per example         data / options
=================  =========================  ==============================================
``digits``         ``[8, 8, 1]`` in [0, 1]    sklearn, no download; ``test_fraction``, ``seed``
``mnist``          ``[28, 28, 1]`` in [0, 1]  TFDS ``array_record`` in ``data_dir``
``fashion_mnist``  ``[28, 28, 1]`` in [0, 1]  TFDS ``array_record`` in ``data_dir``
``cifar10``        ``[32, 32, 3]`` in [0, 1]  TFDS ``array_record`` in ``data_dir``
``nmnist``         ``[T, 34, 34, 2]`` counts  ``data_dir/{Train,Test}/<digit>/*.bin``;
                                              ``cache_dir``, ``cache``
``cifar10dvs``     ``[T, h, w, 2]`` counts    ``data_dir/<class>/*.aedat``; ``size``,
                                              ``train_ratio``, ``cache_dir``, ``cache``
``dvs128_gesture`` ``[T, h, w, 2]`` counts    ``data_dir/DvsGesture/user*.aedat`` + labels CSVs; ``size``
``ncaltech101``    ``[T, h, w, 2]`` counts    ``data_dir/Caltech101/<class>/*.bin``; ``size``,
                                              ``train_ratio``, ``background``
``shd``, ``ssc``   ``[T, 700]`` counts        ``data_dir/{shd,ssc}_{split}.h5``
``image_folder``   ``[s, s, 3]`` in [0, 1]    ``data_dir/{train,val}/<class>/*``; ``size``, ``flip``,
                                              ``num_workers``
``tonic``          ``[T, H, W, P]`` counts    a ``tonic.datasets`` class's files; ``tonic_dataset``,
                                              ``tonic_transforms``, ``tonic_augment``, ``num_classes``,
                                              ``num_workers``
``synthetic_dvs``  ``[T, 48, 48, 2]`` counts  generated; ``num_examples``, ``size``,
                                              ``num_classes``, ``seed``, ``peak_rate``, ``noise_rate``
=================  =========================  ==============================================

The event-frame datasets (``nmnist`` to ``ncaltech101``) also take ``split_by``, ``duration``,
the training augmentations ``flip``, ``translate``, ``crop_scale``, ``roll``, ``rotate``, ``cutout``,
``nda`` and ``temporal_delete`` (:class:`snnjax.data.augment.EventAugment`), ``num_workers``,
``cache_dir`` and ``cache``; ``shd`` and ``ssc`` take ``split_by``, ``duration``, ``temporal_delete``,
``num_workers``, ``cache_dir``, ``cache`` (see :mod:`snnjax.data.frames`) and ``read_timeout`` (seconds the
first read of an HDF5 file, in a child process, may take; default 120). With
``temporal_delete=k`` the training split's examples hold ``k`` of the ``time_steps`` frames built.

Each entry says whether the source reads files (``reads_files``: it takes a ``data_dir``),
whether its examples are event frames with their own time axis (``events``: it takes
``time_steps``), and its options with their types.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from snnjax.data.cifar10dvs import cifar10dvs_source
from snnjax.data.digits import digits_source
from snnjax.data.dvs128_gesture import dvs128_gesture_source
from snnjax.data.event_folder import EVENT_OPTIONS
from snnjax.data.image_folder import image_folder_source
from snnjax.data.ncaltech101 import ncaltech101_source
from snnjax.data.nmnist import nmnist_source
from snnjax.data.shd import shd_source, ssc_source
from snnjax.data.source import Source
from snnjax.data.synthetic import SyntheticDVSSource
from snnjax.data.tfds_images import TfdsImageSource
from snnjax.data.tonic_source import tonic_dataset_source


@dataclasses.dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset.

    Attributes:
      make: ``make(split, **kwargs) -> Source``; kwargs are ``data_dir`` if ``reads_files``,
        ``time_steps`` if ``events``, and any of ``options``.
      reads_files: takes a ``data_dir``.
      events: examples are event frames ``[T, H, W, C]`` integrated into ``time_steps`` frames.
      options: the extra keyword options and their types.
    """

    make: Callable[..., Source]
    reads_files: bool
    events: bool
    options: Mapping[str, type] = dataclasses.field(default_factory=dict)


def _tfds(name: str) -> Callable[..., Source]:
    def make(split: str, *, data_dir: str | os.PathLike | None) -> Source:
        return TfdsImageSource(name, split, data_dir)
    return make


# shd / ssc: the integration, temporal_delete, decoding threads and the cache of the event datasets, and the
# seconds the first (child-process) read of an HDF5 file may take
_HEIDELBERG = {**{k: EVENT_OPTIONS[k] for k in ("split_by", "duration", "temporal_delete", "num_workers",
                                                "cache_dir", "cache")}, "read_timeout": float}
DATASETS: dict[str, DatasetEntry] = {
    "digits": DatasetEntry(digits_source, reads_files=False, events=False,
                           options={"test_fraction": float, "seed": int}),
    "mnist": DatasetEntry(_tfds("mnist"), reads_files=True, events=False),
    "fashion_mnist": DatasetEntry(_tfds("fashion_mnist"), reads_files=True, events=False),
    "cifar10": DatasetEntry(_tfds("cifar10"), reads_files=True, events=False),
    "nmnist": DatasetEntry(nmnist_source, reads_files=True, events=True, options=EVENT_OPTIONS),
    "cifar10dvs": DatasetEntry(cifar10dvs_source, reads_files=True, events=True,
                               options={"size": int, "train_ratio": float, **EVENT_OPTIONS}),
    "dvs128_gesture": DatasetEntry(dvs128_gesture_source, reads_files=True, events=True,
                                   options={"size": int, **EVENT_OPTIONS}),
    "ncaltech101": DatasetEntry(ncaltech101_source, reads_files=True, events=True,
                                options={"size": int, "train_ratio": float, "background": bool, **EVENT_OPTIONS}),
    "shd": DatasetEntry(shd_source, reads_files=True, events=True, options=_HEIDELBERG),
    "ssc": DatasetEntry(ssc_source, reads_files=True, events=True, options=_HEIDELBERG),
    "image_folder": DatasetEntry(image_folder_source, reads_files=True, events=False,
                                 options={"size": int, "flip": bool, "num_workers": int}),
    "tonic": DatasetEntry(tonic_dataset_source, reads_files=True, events=True,
                          options={"tonic_dataset": str, "tonic_transforms": str, "tonic_augment": str,
                                   "num_classes": int, "num_workers": int}),
    "synthetic_dvs": DatasetEntry(SyntheticDVSSource, reads_files=False, events=True,
                                  options={"num_examples": int, "size": int, "num_classes": int, "seed": int,
                                           "peak_rate": float, "noise_rate": float}),
}
SOURCE_NAMES = tuple(DATASETS)


def _option_types() -> dict[str, type]:
    types: dict[str, type] = {}
    for name, entry in DATASETS.items():
        for key, kind in entry.options.items():
            if types.setdefault(key, kind) is not kind:
                raise TypeError(f"dataset option {key!r} is a {types[key].__name__} elsewhere but a "
                                f"{kind.__name__} for {name!r}")
    return types


# Every option of any dataset and its type (the training config holds one typed slot per option).
OPTION_TYPES: dict[str, type] = _option_types()


def dataset(name: str) -> DatasetEntry:
    """The registry entry of ``name``; ``ValueError`` listing :data:`SOURCE_NAMES` if unknown."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(SOURCE_NAMES)}")
    return DATASETS[name]


def get_source(name: str, split: str, *, data_dir: str | os.PathLike | None = None,
               time_steps: int | None = None, **options: Any) -> Source:
    """The dataset ``name``'s ``split`` as a :class:`Source`.

    Args:
      data_dir: where a source that reads files finds them (must be None for the others).
      time_steps: ``T`` frames per example for event sources (None: the source's default);
        static-image sources ignore it (the step's encoder makes their ``T`` steps).
      options: the dataset's options (see the table above).

    Raises:
      ValueError: unknown ``name`` (the message lists :data:`SOURCE_NAMES`), split or option, or a
        ``data_dir`` given to a source that reads no files.
      FileNotFoundError: the dataset's files are not in ``data_dir``.
    """
    entry = dataset(name)
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        raise ValueError(f"dataset {name!r} has no option(s) {unknown}; its options: {sorted(entry.options)}")
    kwargs = dict(options)
    if entry.reads_files:
        kwargs["data_dir"] = data_dir
    elif data_dir is not None:
        raise ValueError(f"{name} reads no files; do not pass data_dir")
    if entry.events and time_steps is not None:
        kwargs["time_steps"] = time_steps
    return entry.make(split, **kwargs)
