"""N-Caltech101 (Orchard et al. 2015): Caltech101 images recorded with a moving ATIS sensor.

Layout (the extracted ``Caltech101.zip``; ``data_dir`` may be the ``Caltech101`` folder or the
folder holding it)::

    Caltech101/<class>/image_0001.bin ...     101 object classes and BACKGROUND_Google

Files are ATIS ``.bin`` as N-MNIST's (5 bytes per event; :func:`snnjax.data.nmnist.read_atis_bin`),
on a sensor SpikingJelly takes as 180 rows x 240 columns (``NCaltech101.get_H_W``). As SpikingJelly's
``NCaltech101`` (a ``DatasetFolder`` over every class folder), ``BACKGROUND_Google`` is a class
like the others (102 classes in the release; ``background=False`` leaves it out), classes are
numbered in sorted folder-name order (upper case first: ``BACKGROUND_Google``, ``Faces_easy``,
``Leopards``, ``Motorbikes``, ``accordion``, ...) and files in sorted name order. There is no
official split: as ``split_to_train_test_set(train_ratio, dataset, num_classes)`` with
``random_split=False``, the first ``ceil(train_ratio * n_c)`` files of each class form ``"train"``
and the rest ``"test"`` (``train_ratio`` 0.9 by default). Frame caches default to folders beside the
class folders (``frames_*``, ``custom_*``), which are therefore not read as classes.
"""
from __future__ import annotations

import os
from pathlib import Path

from snnjax.data.cifar10dvs import split_files_by_ratio
from snnjax.data.event_folder import EventFolderSource, event_settings
from snnjax.data.events import Events
from snnjax.data.nmnist import read_atis_bin

NCALTECH101_SIZE = (180, 240)
BACKGROUND = "BACKGROUND_Google"
_HINT = ("Download Caltech101.zip from https://www.garrickorchard.com/datasets/n-caltech101 and extract it so "
         "that data_dir/Caltech101/<class>/*.bin exists (101 classes and BACKGROUND_Google).")


def read_ncaltech101_bin(path: str | os.PathLike) -> Events:
    """Decodes one N-Caltech101 ``.bin`` (ATIS, 180x240); ``ValueError`` naming a corrupt file."""
    return read_atis_bin(path, NCALTECH101_SIZE)


def ncaltech101_source(split: str, *, data_dir: str | os.PathLike | None, time_steps: int = 10,
                       train_ratio: float = 0.9, background: bool | None = None,
                       split_by: str | None = None, duration: int | None = None,
                       size: int | tuple[int, int] | None = None,
                       flip: bool | None = None, translate: int | None = None, crop_scale: float | None = None,
                       roll: int | None = None, rotate: float | None = None, cutout: int | None = None,
                       nda: bool | None = None, temporal_delete: int | None = None, num_workers: int = 1,
                       cache_dir: str | os.PathLike | None = None, cache: bool = True) -> EventFolderSource:
    """N-Caltech101 frames ``[n, T, h, w, 2]`` (event counts, area means if resized).

    Args:
      split: ``"train"``, ``"test"`` or ``"all"``.
      data_dir: the ``Caltech101`` folder, or the folder holding it.
      time_steps: ``T``.
      train_ratio: fraction of each class (first files by name) in ``"train"``.
      background: keep ``BACKGROUND_Google`` as a class (default True, as SpikingJelly).
      split_by, duration: the integration (``duration`` in microseconds); see :class:`FrameSpec`.
      size: an int or ``(h, w)`` to area-resize to (None: 180x240).
      the augmentations, num_workers, cache_dir, cache: as :func:`dvs128_gesture_source`.
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"ncaltech101 split must be 'train', 'test' or 'all', got {split!r}")
    if not 0.0 < train_ratio <= 1.0:
        raise ValueError(f"train_ratio must be in (0, 1], got {train_ratio}")
    if data_dir is None:
        raise ValueError(f"ncaltech101 needs data_dir. {_HINT}")
    root = Path(data_dir)
    if (root / "Caltech101").is_dir():
        root = root / "Caltech101"
    if not root.is_dir():
        raise FileNotFoundError(f"ncaltech101: directory {root} not found. {_HINT}")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("frames_")
                     and not d.name.startswith("custom_"))
    if background is False:
        classes = [c for c in classes if c != BACKGROUND]
    files_per_class = [[root / c / n for n in sorted(f.name for f in (root / c).iterdir()
                                                     if f.suffix == ".bin" and f.is_file())] for c in classes]
    empty = [c for c, files in zip(classes, files_per_class, strict=True) if not files]
    if len(classes) < 2 or empty:
        raise FileNotFoundError(f"ncaltech101: {root} holds {len(classes)} class folder(s)"
                                f"{'; without .bin files: ' + ', '.join(empty[:5]) if empty else ''}. {_HINT}")
    files, labels = split_files_by_ratio(files_per_class, split, train_ratio)
    if not files:
        raise FileNotFoundError(f"ncaltech101: no .bin files for split {split!r} under {root}. {_HINT}")
    if isinstance(size, int):
        size = (size, size)
    spec, augment = event_settings(split, time_steps, split_by, duration, flip=flip, translate=translate,
                                   crop_scale=crop_scale, roll=roll, rotate=rotate, cutout=cutout, nda=nda,
                                   temporal_delete=temporal_delete)
    return EventFolderSource(root, files, labels, reader=read_ncaltech101_bin, sensor_size=NCALTECH101_SIZE,
                             num_classes=len(classes), frames=spec, size=size, cache_dir=cache_dir,
                             cache=cache, augment=augment, num_workers=num_workers, name="ncaltech101")
