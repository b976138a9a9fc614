"""A source over raw event recordings, integrated into frames and cached.

Every example is one event file (or, in subclasses, one labelled part of one).
On first access it is decoded by a dataset-specific ``reader``, integrated into
``T`` frames by a :class:`~snnjax.data.frames.FrameSpec` (SpikingJelly's
``split_by='number'`` unless told otherwise), optionally area-resized, and saved
under ``cache_root`` (mirroring the file's path below ``root``, suffix ``.npz``);
later accesses read the cache. ``cache_root`` defaults to
``root / spec.cache_name`` (``frames_T{T}``, ``frames_T{T}_time``,
``frames_T{T}_duration{D}``, ``custom_<name>_T{T}``; ``_area{h}x{w}`` appended when
resized), so different settings never share files; each cache file also records
the raw file's size and modification time and is rebuilt when they change.

Building is resumable: each example's cache file is written atomically on its
own, so an interrupted run keeps what it built. The examples still to build are
counted on the first miss and a ``tqdm`` bar follows them.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from snnjax.data.augment import AugmentedFrames, EventAugment
from snnjax.data.events import Events, resize_area
from snnjax.data.frame_cache import load_frames, save_frames
from snnjax.data.frames import FrameSpec
from snnjax.data.workers import Workers


class EventFolderSource(AugmentedFrames):
    """Event files -> frames ``[n, T, h, w, 2]`` float32 (event counts, or their area means if resized).

    Args:
      root: dataset folder the ``files`` lie under.
      files: raw event files, one per example, in dataset order.
      labels: class index of each file.
      reader: decodes one file into :class:`Events`.
      sensor_size: ``(H, W)`` of the sensor.
      num_classes: number of classes.
      time_steps: ``T``, the number of frames per example (with the default ``split_by='number'``).
      frames: the integration (overrides ``time_steps``); see :class:`FrameSpec`.
      size: optional ``(h, w)`` (an int: square) to area-resize frames to; ``None`` keeps ``(H, W)``.
      cache_dir: folder that holds the cache subfolder (default ``root``).
      cache: whether to read and write the frame cache.
      augment: per-example augmentation applied when the loader passes keys (training); with its
        ``temporal_delete`` the examples hold that many of the ``T`` frames built (``time_steps`` says so).
      num_workers: threads that decode a batch's examples (1: the caller's thread).
      name: the dataset's name in progress bars and errors.
    """

    def __init__(self, root: Path, files: Sequence[Path], labels: Sequence[int], *,
                 reader: Callable[[Path], Events], sensor_size: tuple[int, int], num_classes: int,
                 time_steps: int | None = None, frames: FrameSpec | None = None,
                 size: int | tuple[int, int] | None = None, cache_dir: str | os.PathLike | None = None,
                 cache: bool = True, augment: EventAugment | None = None, num_workers: int = 1,
                 name: str = "events"):
        if frames is None:
            frames = FrameSpec(time_steps=10 if time_steps is None else time_steps)
        if len(files) != len(labels):
            raise ValueError(f"{len(files)} files but {len(labels)} labels")
        self.root = Path(root)
        self.files = [Path(f) for f in files]
        self.labels = np.asarray(labels, np.int32)
        self.reader = reader
        self.spec = frames
        self.sensor_size = tuple(sensor_size)
        if isinstance(size, int):
            size = (size, size)
        self.size = self.sensor_size if size is None else (int(size[0]), int(size[1]))
        self.num_classes = int(num_classes)
        self.augment = augment if augment is not None and augment.active else None
        self._set_steps()
        subdir = frames.cache_name
        if self.size != self.sensor_size:
            subdir += f"_area{self.size[0]}x{self.size[1]}"
        self.cache_root = Path(cache_dir if cache_dir is not None else self.root) / subdir
        self.cache = cache
        self.workers = Workers(num_workers, name)
        self.num_workers = self.workers.count
        self.name = name
        self._lock = threading.Lock()
        self._bar = None

    def _set_steps(self) -> None:
        """``time_steps`` / ``example_shape`` of a read: the frames built, or fewer after a temporal delete."""
        steps = self.spec.time_steps
        self.time_steps = steps if self.augment is None else self.augment.time_steps(steps)
        self.example_shape = (self.time_steps, *self.size, 2)

    def __len__(self) -> int:
        return len(self.files)

    def with_frames(self, frames: FrameSpec) -> EventFolderSource:
        """The same examples integrated by ``frames`` (e.g. a custom integrator), cached apart."""
        other = copy.copy(self)
        other.spec = frames
        other._set_steps()
        name = frames.cache_name + (f"_area{self.size[0]}x{self.size[1]}" if self.size != self.sensor_size else "")
        other.cache_root = self.cache_root.parent / name
        other._lock, other._bar = threading.Lock(), None
        return other

    # ------------------------------------------------------------------ per-example hooks (subclasses)

    def events(self, index: int) -> Events:
        """The decoded events of example ``index`` (``ValueError`` naming the file if corrupt)."""
        return self.reader(self.files[index])

    def cache_path(self, index: int) -> Path:
        """Where example ``index``'s frames are cached."""
        return self.cache_root / self.files[index].relative_to(self.root).with_suffix(".npz")

    def cache_key(self, index: int) -> str:
        """What example ``index``'s cached frames must have been built from."""
        stat = self.files[index].stat()
        return f"size={stat.st_size};mtime_ns={stat.st_mtime_ns};{self.spec.cache_name};{self.size}"

    # ------------------------------------------------------------------ frames

    def compute_frames(self, index: int) -> np.ndarray:
        """Decodes and integrates example ``index`` without the cache: ``[T, h, w, 2]`` float32.

        Raises:
          ValueError: the file cannot be decoded, its events do not fit the sensor, or the
            integration mode cannot split them (naming the file).
        """
        events = self.events(index)
        try:
            frames = self.spec.integrate(events, *self.sensor_size)
        except ValueError as err:
            raise ValueError(f"{self.files[index]}: {err}") from err
        if self.size != self.sensor_size:
            frames = resize_area(frames, *self.size)
        return frames

    def frames(self, index: int) -> np.ndarray:
        """Frames of example ``index``, ``[T, h, w, 2]`` float32, from the cache when valid."""
        if not self.cache:
            return self.compute_frames(index)
        path = self.cache_path(index)
        key = self.cache_key(index)
        frames = load_frames(path, (self.spec.time_steps, *self.size, 2), key)
        if frames is None:
            self._start_progress()
            frames = self._build(index)
        return frames

    def _save(self, index: int, frames: np.ndarray) -> None:
        path = self.cache_path(index)
        try:
            save_frames(path, frames, self.cache_key(index))
        except OSError as err:
            raise OSError(f"cannot write the frame cache {path}; pass cache_dir=<writable folder> "
                          "(data.options.cache_dir) or cache=False") from err
        self._advance_progress()

    def _build(self, index: int) -> np.ndarray:
        """Computes and caches example ``index`` (subclasses may cache others read from the same file)."""
        frames = self.compute_frames(index)
        self._save(index, frames)
        return frames

    def _start_progress(self) -> None:
        with self._lock:
            if self._bar is not None:
                return
            missing = sum(not self.cache_path(i).exists() for i in range(len(self)))
            self._bar = tqdm(total=max(missing, 1), desc=f"{self.name}: building {self.cache_root.name}",
                             unit="example", leave=False)

    def _advance_progress(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.update(1)
                if self._bar.n >= self._bar.total:
                    self._bar.close()

    def _build_order(self) -> list[int]:
        """The order :meth:`prepare` builds examples in (subclasses group examples of one file)."""
        return list(range(len(self)))

    def prepare(self, num_workers: int | None = None) -> None:
        """Builds (or validates) the cache of every example, with ``num_workers`` threads."""
        with ThreadPoolExecutor(max_workers=num_workers or min(8, os.cpu_count() or 1)) as pool:
            for _ in pool.map(self.frames, self._build_order()):
                pass


# The keywords every event-file dataset (nmnist, cifar10dvs, dvs128_gesture, ncaltech101) takes besides its own,
# with the type the training config holds each as (``data.options.<name>``): the frame integration
# (``split_by``: "number" (unset), "time" or "duration", with ``duration`` in microseconds; FrameSpec), the
# training augmentations (EventAugment's fields, off when unset; ``temporal_delete`` keeps that many of the ``T``
# frames), the threads decoding a batch (``num_workers``, 1) and the frame cache (``cache_dir``, ``cache``: see
# EventFolderSource; the cache is on unless ``cache=False``).
EVENT_OPTIONS: dict[str, type] = {
    "split_by": str, "duration": int, "temporal_delete": int, "num_workers": int, "flip": bool, "translate": int,
    "crop_scale": float, "roll": int, "rotate": float, "cutout": int, "nda": bool, "cache_dir": str, "cache": bool}
_AUGMENT = tuple(f.name for f in dataclasses.fields(EventAugment))


def dataset_root(dataset: str, data_dir: str | os.PathLike | None, hint: str, folder: str | None = None) -> Path:
    """An event dataset's folder: ``data_dir``, or ``data_dir/folder`` where that exists (the folder its archive
    unpacks to).

    Raises:
      ValueError: ``data_dir`` is None. FileNotFoundError: the folder does not exist (both naming ``dataset`` and
      ``hint``, where to get the data).
    """
    if data_dir is None:
        raise ValueError(f"{dataset} needs data_dir. {hint}")
    root = Path(data_dir)
    if folder is not None and (root / folder).is_dir():
        root = root / folder
    return require_dir(root, dataset, hint)


def require_dir(path: Path, dataset: str, hint: str) -> Path:
    """``path`` if it is a directory, else a FileNotFoundError naming ``dataset`` and ``hint``."""
    if not path.is_dir():
        raise FileNotFoundError(f"{dataset}: directory {path} not found. {hint}")
    return path


def event_settings(dataset: str, split: str, time_steps: int, options: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`EventFolderSource`'s keywords from ``frames`` on for an event dataset's ``options``
    (:data:`EVENT_OPTIONS`; None or unset: the default): ``frames``, ``augment`` (on ``"train"`` only),
    ``num_workers``, ``cache_dir`` and ``cache``.

    The augmentation is checked on every split (``temporal_delete`` against ``time_steps`` too), so a bad option
    fails whichever split is built first. Raises ``TypeError`` naming an option ``dataset`` does not take.
    """
    unknown = sorted(set(options) - set(EVENT_OPTIONS))
    if unknown:
        raise TypeError(f"{dataset}_source() got unexpected keyword argument(s) {unknown}; the event datasets' "
                        f"options: {list(EVENT_OPTIONS)}")
    frames = FrameSpec(time_steps=time_steps, split_by=options.get("split_by") or "number",
                       duration=options.get("duration"))
    augment = EventAugment(**{k: options[k] for k in _AUGMENT if options.get(k) is not None})
    augment.time_steps(time_steps)
    return {"frames": frames, "augment": augment if split == "train" and augment.active else None,
            "num_workers": options.get("num_workers", 1), "cache_dir": options.get("cache_dir"),
            "cache": options.get("cache", True)}

