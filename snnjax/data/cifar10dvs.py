"""CIFAR10-DVS (Li et al. 2017): CIFAR-10 images recorded with a 128x128 DVS.

Layout (the ten extracted class zips)::

    data_dir/<class name>/*.aedat     airplane automobile bird cat deer dog frog horse ship truck

Decoding follows SpikingJelly's ``CIFAR10DVS`` reader: skip the ASCII header
(lines whose stripped text starts with ``#``), read the rest as big-endian
32-bit words in (address, timestamp) pairs, and take from the address
``polarity = addr & 0x1``, ``x_raw = (addr & 0xFE) >> 1``,
``y_raw = (addr & 0x7F00) >> 8``; events are ``x = 127 - y_raw``,
``y = 127 - x_raw``, ``p = 1 - polarity``.

The files are jAER's AEDAT 2.0: a first line ``#!AER-DAT2.0``, more ``#``
header lines, then 8 bytes per event. A file that is not (another format,
random bytes), whose payload is not a whole number of events or is empty, or
whose timestamps are not in time order (see :func:`snnjax.data.events.check_events`)
raises a ``ValueError`` naming it, rather than being trained on.

There is no official split. As SpikingJelly users do with
``split_to_train_test_set(0.9, dataset, 10)`` (``random_split=False``), the
first ``ceil(0.9 * n_c)`` files of each class, in sorted file-name order (the
order of SpikingJelly's ``DatasetFolder``), form ``"train"`` and the rest
``"test"``. Labels are class indices in the order above (sorted names).

Optional ``size`` area-resizes frames (e.g. 48 for CIFAR10DVSVGG): each output
pixel is the mean event count over its input window, as
``F.interpolate(frames, size, mode='area')`` does.
"""
from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from snnjax.data.event_folder import EventFolderSource, dataset_root, event_settings, require_dir
from snnjax.data.events import Events, check_events

CIFAR10DVS_CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer",
                          "dog", "frog", "horse", "ship", "truck")
CIFAR10DVS_SIZE = (128, 128)
AEDAT_MAGIC = b"#!AER-DAT"  # the first line of an AEDAT file: magic, then the version ("2.0")
_HINT = ("Download CIFAR10-DVS (https://figshare.com/articles/dataset/CIFAR10-DVS_New/4724671) and "
         "extract the ten class zips so that data_dir/<class>/*.aedat exists for the classes "
         f"{', '.join(CIFAR10DVS_CLASS_NAMES)}.")


def aedat_header_length(content: bytes) -> int:
    """Bytes of the leading ``#`` header lines, counted exactly as SpikingJelly's ``_skip_header``."""
    stream = io.BytesIO(content)
    length = 0
    line = stream.readline()
    try:
        text = line.decode().strip()
    except UnicodeDecodeError:
        return 0
    while text and text[0] == "#":
        length += len(line)
        line = stream.readline()
        try:
            text = line.decode().strip()
        except UnicodeDecodeError:
            break
    return length


def aedat_version(path: str | os.PathLike, content: bytes) -> str:
    """The version in the first line of AEDAT ``content`` (``"2.0"``); ``ValueError`` naming ``path`` if none."""
    first = content.split(b"\n", 1)[0].strip()
    if not first.startswith(AEDAT_MAGIC):
        raise ValueError(f"{path}: not an AEDAT file: the first line should be {AEDAT_MAGIC.decode()}2.0, found "
                         f"{first[:40]!r}. The file is corrupt or of another format; replace or remove it")
    return first[len(AEDAT_MAGIC):].decode("ascii", errors="replace")


def read_cifar10dvs_aedat(path: str | os.PathLike) -> Events:
    """Decodes one CIFAR10-DVS ``.aedat`` file into int64 :class:`Events` (``t`` in microseconds).

    Raises:
      ValueError: naming ``path``: not AEDAT 2.x, a payload that is not a whole number of 8-byte
        events or holds none, or events that cannot be a recording (see ``check_events``).
    """
    content = Path(path).read_bytes()
    version = aedat_version(path, content)
    if not version.startswith("2."):
        raise ValueError(f"{path}: AEDAT version {version!r}; CIFAR10-DVS files are AEDAT 2.0 (8-byte "
                         "big-endian address/timestamp events), the only layout this reader decodes")
    data = content[aedat_header_length(content):]
    if len(data) % 8:
        raise ValueError(f"{path}: {len(data)} data bytes after the header is not a whole number of "
                         "(address, timestamp) pairs of big-endian 32-bit words: the file is truncated or corrupt")
    words = np.frombuffer(data, dtype=">u4").astype(np.int64)
    addr, t = words[0::2], words[1::2]
    polarity = addr & 0x1
    x_raw = (addr & 0xFE) >> 1
    y_raw = (addr & 0x7F00) >> 8
    events = Events(t=t, x=127 - y_raw, y=127 - x_raw, p=1 - polarity)
    return check_events(path, events, *CIFAR10DVS_SIZE)


def check_split(dataset: str, split: str, train_ratio: float) -> None:
    """``ValueError`` unless ``split`` is ``"train"``, ``"test"`` or ``"all"`` and ``0 < train_ratio <= 1`` (the
    datasets split by ratio: cifar10dvs, ncaltech101)."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"{dataset} split must be 'train', 'test' or 'all', got {split!r}")
    if not 0.0 < train_ratio <= 1.0:
        raise ValueError(f"train_ratio must be in (0, 1], got {train_ratio}")


def split_files_by_ratio(files_per_class: list[list[Path]], split: str,
                         train_ratio: float) -> tuple[list[Path], list[int]]:
    """SpikingJelly's ``split_to_train_test_set`` (``random_split=False``) on per-class file lists."""
    files, labels = [], []
    for label, class_files in enumerate(files_per_class):
        cut = math.ceil(len(class_files) * train_ratio)
        chosen = {"train": class_files[:cut], "test": class_files[cut:], "all": class_files}[split]
        files += chosen
        labels += [label] * len(chosen)
    return files, labels


def cifar10dvs_source(split: str, *, data_dir: str | os.PathLike | None, time_steps: int = 10,
                      size: int | tuple[int, int] | None = None, train_ratio: float = 0.9,
                      **options: Any) -> EventFolderSource:
    """CIFAR10-DVS frames ``[n, T, h, w, 2]`` (event counts, area-averaged if resized).

    Args:
      split: ``"train"``, ``"test"`` or ``"all"``.
      data_dir: folder holding the ten class folders of ``.aedat`` files.
      time_steps: ``T``, frames per example (equal event counts per frame).
      size: ``None`` for 128x128, an int or ``(h, w)`` to area-resize to.
      train_ratio: fraction of each class (first files by name) in ``"train"``.
      options: the event datasets' keywords, :data:`snnjax.data.event_folder.EVENT_OPTIONS` (``split_by``,
        ``duration``, the augmentations, ``num_workers``, ``cache_dir``, ``cache``).
    """
    check_split("cifar10dvs", split, train_ratio)
    settings = event_settings("cifar10dvs", split, time_steps, options)  # options checked first
    root = dataset_root("cifar10dvs", data_dir, _HINT)
    files_per_class = []
    for name in CIFAR10DVS_CLASS_NAMES:
        class_dir = require_dir(root / name, "cifar10dvs", _HINT)
        names = sorted(f.name for f in class_dir.iterdir() if f.suffix == ".aedat" and f.is_file())
        files_per_class.append([class_dir / n for n in names])
    files, labels = split_files_by_ratio(files_per_class, split, train_ratio)
    if not files:
        raise FileNotFoundError(f"cifar10dvs: no .aedat files for split {split!r} under {root}. {_HINT}")
    return EventFolderSource(root, files, labels, reader=read_cifar10dvs_aedat, sensor_size=CIFAR10DVS_SIZE,
                             num_classes=10, size=size, name="cifar10dvs",
                             **settings)
