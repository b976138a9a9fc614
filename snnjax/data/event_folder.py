"""A source over a folder of raw event files, integrated into frames and cached.

Every example is one event file. On first access it is decoded by a
dataset-specific ``reader``, integrated into ``T`` frames of equal event count
(:func:`snnjax.data.events.integrate_by_number`), optionally area-resized, and
saved under ``cache_root`` (mirroring the file's path below ``root``, suffix
``.npz``); later accesses read the cache. ``cache_root`` defaults to
``root / "frames_T{T}"`` (``"frames_T{T}_area{h}x{w}"`` when resized), so
different ``T`` or sizes never share files.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from snnjax.data.events import Events, integrate_by_number, resize_area
from snnjax.data.frame_cache import load_frames, save_frames
from snnjax.data.source import Source


class EventFolderSource(Source):
    """Event files -> frames ``[n, T, h, w, 2]`` float32 (event counts, or their area means if resized).

    Args:
      root: dataset folder the ``files`` lie under.
      files: raw event files, one per example, in dataset order.
      labels: class index of each file.
      reader: decodes one file into :class:`Events`.
      sensor_size: ``(H, W)`` of the sensor.
      num_classes: number of classes.
      time_steps: ``T``, the number of frames per example.
      size: optional ``(h, w)`` to area-resize frames to; ``None`` keeps ``(H, W)``.
      cache_dir: folder that holds the ``frames_T{T}...`` cache subfolder (default ``root``).
      cache: whether to read and write the frame cache.
    """

    def __init__(self, root: Path, files: Sequence[Path], labels: Sequence[int], *,
                 reader: Callable[[Path], Events], sensor_size: tuple[int, int], num_classes: int,
                 time_steps: int, size: tuple[int, int] | None = None,
                 cache_dir: str | os.PathLike | None = None, cache: bool = True):
        if time_steps < 1:
            raise ValueError(f"time_steps must be >= 1, got {time_steps}")
        if len(files) != len(labels):
            raise ValueError(f"{len(files)} files but {len(labels)} labels")
        self.root = Path(root)
        self.files = [Path(f) for f in files]
        self.labels = np.asarray(labels, np.int32)
        self.reader = reader
        self.sensor_size = tuple(sensor_size)
        self.size = self.sensor_size if size is None else (int(size[0]), int(size[1]))
        self.num_classes = int(num_classes)
        self.time_steps = int(time_steps)
        self.example_shape = (self.time_steps, *self.size, 2)
        subdir = f"frames_T{self.time_steps}"
        if self.size != self.sensor_size:
            subdir += f"_area{self.size[0]}x{self.size[1]}"
        self.cache_root = Path(cache_dir if cache_dir is not None else self.root) / subdir
        self.cache = cache

    def __len__(self) -> int:
        return len(self.files)

    def cache_path(self, index: int) -> Path:
        """Where example ``index``'s frames are cached."""
        return self.cache_root / self.files[index].relative_to(self.root).with_suffix(".npz")

    def compute_frames(self, index: int) -> np.ndarray:
        """Decodes and integrates example ``index`` without the cache: ``[T, h, w, 2]`` float32.

        Raises:
          ValueError: the file cannot be decoded or its events do not fit the sensor (naming the file).
        """
        path = self.files[index]
        events = self.reader(path)
        try:
            frames = integrate_by_number(events, self.time_steps, *self.sensor_size)
        except ValueError as err:  # a reader that does not check its events itself
            raise ValueError(f"{path}: {err}") from err
        if self.size != self.sensor_size:
            frames = resize_area(frames, *self.size)
        return frames

    def frames(self, index: int) -> np.ndarray:
        """Frames of example ``index``, ``[T, h, w, 2]`` float32, from the cache when valid."""
        if not self.cache:
            return self.compute_frames(index)
        path = self.cache_path(index)
        source_size = self.files[index].stat().st_size
        frames = load_frames(path, self.example_shape, source_size)
        if frames is None:
            frames = self.compute_frames(index)
            try:
                save_frames(path, frames, source_size)
            except OSError as err:
                raise OSError(f"cannot write the frame cache {path}; pass cache_dir=<writable folder> "
                              "or cache=False") from err
        return frames

    def prepare(self, num_workers: int | None = None) -> None:
        """Builds (or validates) the cache of every example, with ``num_workers`` threads."""
        with ThreadPoolExecutor(max_workers=num_workers or min(8, os.cpu_count() or 1)) as pool:
            for _ in pool.map(self.frames, range(len(self))):
                pass

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        frames = np.stack([self.frames(int(i)) for i in indices])
        return frames, self.labels[indices]


def require_dir(path: Path, dataset: str, hint: str) -> Path:
    """``path`` if it is a directory, else a FileNotFoundError naming ``dataset`` and ``hint``."""
    if not path.is_dir():
        raise FileNotFoundError(f"{dataset}: directory {path} not found. {hint}")
    return path
