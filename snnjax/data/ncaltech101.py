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
from typing import Any

from snnjax.data.cifar10dvs import check_split, split_files_by_ratio
from snnjax.data.event_folder import EventFolderSource, dataset_root, event_settings
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
                       size: int | tuple[int, int] | None = None, **options: Any) -> EventFolderSource:
    """N-Caltech101 frames ``[n, T, h, w, 2]`` (event counts, area means if resized).

    Args:
      split: ``"train"``, ``"test"`` or ``"all"``.
      data_dir: the ``Caltech101`` folder, or the folder holding it.
      time_steps: ``T``.
      train_ratio: fraction of each class (first files by name) in ``"train"``.
      background: keep ``BACKGROUND_Google`` as a class (default True, as SpikingJelly).
      size: an int or ``(h, w)`` to area-resize to (None: 180x240).
      options: the event datasets' keywords, :data:`snnjax.data.event_folder.EVENT_OPTIONS` (``split_by``,
        ``duration``, the augmentations, ``num_workers``, ``cache_dir``, ``cache``).
    """
    check_split("ncaltech101", split, train_ratio)
    settings = event_settings("ncaltech101", split, time_steps, options)  # options checked first
    root = dataset_root("ncaltech101", data_dir, _HINT, "Caltech101")
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
    return EventFolderSource(root, files, labels, reader=read_ncaltech101_bin, sensor_size=NCALTECH101_SIZE,
                             num_classes=len(classes), size=size, name="ncaltech101",
                             **settings)
