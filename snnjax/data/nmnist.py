"""N-MNIST (Orchard et al. 2015): saccade recordings of MNIST digits on a 34x34 ATIS sensor.

Layout (the extracted ``Train.zip`` / ``Test.zip``)::

    data_dir/Train/<digit>/*.bin      digit folders "0" .. "9"
    data_dir/Test/<digit>/*.bin

Binary format (SpikingJelly's ``load_ATIS_bin``): 5 bytes (40 bits) per event,
``byte0`` x, ``byte1`` y, ``byte2`` bit 7 polarity, and the remaining 23 bits
(``byte2 & 0x7F``, ``byte3``, ``byte4``, big-endian) the timestamp in
microseconds. A file whose size is not a whole number of events, that holds
none, or whose events leave the 34x34 sensor or are out of time order
(:func:`snnjax.data.events.check_events`) raises a ``ValueError`` naming it.
Examples are ordered by class, then by file name (as
SpikingJelly's ``DatasetFolder``), and label = digit.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from snnjax.data.event_folder import EventFolderSource, dataset_root, event_settings, require_dir
from snnjax.data.events import Events, check_events

NMNIST_SIZE = (34, 34)
NMNIST_SPLITS = {"train": "Train", "test": "Test"}
_HINT = ("Download N-MNIST's Train.zip / Test.zip (https://www.garrickorchard.com/datasets/n-mnist) "
         "and extract them so that data_dir/Train/<digit>/*.bin and data_dir/Test/<digit>/*.bin exist.")


def read_nmnist_bin(path: str | os.PathLike) -> Events:
    """Decodes one N-MNIST ``.bin`` file into uint32 :class:`Events` (``t`` in microseconds).

    Raises:
      ValueError: naming ``path``: a size that is not a whole number of 5-byte events, or events
        that cannot be a recording of the 34x34 sensor (see ``check_events``).
    """
    return read_atis_bin(path, NMNIST_SIZE)


def read_atis_bin(path: str | os.PathLike, sensor_size: tuple[int, int]) -> Events:
    """Decodes an ATIS ``.bin`` file (N-MNIST, N-Caltech101) of a ``(H, W)`` sensor into uint32 :class:`Events`."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % 5:
        raise ValueError(f"{path}: {raw.size} bytes is not a whole number of 5-byte events: the file is "
                         "truncated or corrupt")
    raw = raw.astype(np.uint32)
    x = raw[0::5]
    y = raw[1::5]
    p = (raw[2::5] & 128) >> 7
    t = ((raw[2::5] & 127) << 16) | (raw[3::5] << 8) | raw[4::5]
    return check_events(path, Events(t=t, x=x, y=y, p=p), *sensor_size)


def nmnist_source(split: str, *, data_dir: str | os.PathLike | None, time_steps: int = 10,
                  **options: Any) -> EventFolderSource:
    """N-MNIST frames ``[n, T, 34, 34, 2]`` (event counts), labels = digit.

    Args:
      split: ``"train"`` or ``"test"``.
      data_dir: folder holding ``Train/`` and ``Test/``.
      time_steps: ``T``, frames per example (equal event counts per frame by default).
      options: the event datasets' keywords, :data:`snnjax.data.event_folder.EVENT_OPTIONS` (``split_by``,
        ``duration``, the augmentations, ``num_workers``, ``cache_dir``, ``cache``).
    """
    if split not in NMNIST_SPLITS:
        raise ValueError(f"nmnist split must be one of {tuple(NMNIST_SPLITS)}, got {split!r}")
    settings = event_settings("nmnist", split, time_steps, options)  # options checked first
    root = dataset_root("nmnist", data_dir, _HINT)
    split_dir = require_dir(root / NMNIST_SPLITS[split], "nmnist", _HINT)
    files, labels = [], []
    for digit in range(10):
        class_dir = require_dir(split_dir / str(digit), "nmnist", _HINT)
        names = sorted(f.name for f in class_dir.iterdir() if f.suffix == ".bin" and f.is_file())
        files += [class_dir / name for name in names]
        labels += [digit] * len(names)
    if not files:
        raise FileNotFoundError(f"nmnist: no .bin files under {split_dir}. {_HINT}")
    return EventFolderSource(root, files, labels, reader=read_nmnist_bin, sensor_size=NMNIST_SIZE,
                             num_classes=10, name="nmnist", **settings)
