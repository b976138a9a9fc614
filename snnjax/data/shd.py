"""SHD and SSC (Cramer et al. 2020): spoken digits / commands as spikes of 700 cochlea channels.

Layout (the extracted zips of https://zenkelab.org/datasets/)::

    data_dir/shd_train.h5, shd_test.h5                    SHD: 20 classes
    data_dir/ssc_train.h5, ssc_valid.h5, ssc_test.h5      SSC: 35 classes

Each HDF5 file holds ``spikes/times`` (one variable-length array of spike times in seconds per
sample), ``spikes/units`` (the channel, 0..699, of each spike) and ``labels`` (one class per
sample). Examples are the samples in file order, label = ``labels[i]``.

Frames, as SpikingJelly's SHD/SSC builders, ``[T, 700]`` spike counts per channel:

* ``split_by="number"``: ``T`` frames of equal spike count, the last taking the remainder;
* ``split_by="time"``: windows of ``dt = (t[-1] - t[0]) / T`` (divided exactly, unlike the DVS
  datasets' floor); see :func:`snnjax.data.frames.bounds_by_time`;
* ``split_by="duration"``: frames of ``duration`` milliseconds (SpikingJelly takes ``1000 * t``
  and subtracts the first spike time) from the first spike, the first ``T`` kept, shorter samples
  padded with empty frames;
* a custom ``FrameSpec.integrator`` gets ``(Events(t, x=unit, y=0, p=0), T, 1, 700)`` and returns ``[T, 700]``.

The arithmetic stays in the file's dtype, as SpikingJelly's. SpikingJelly's frame datasets
(``DatasetFolder`` over class folders named ``0``, ``1``, ...) sort those names as strings, so
their labels are a permutation of the stored ones for 11 or more classes; labels here are the stored ones.
Frames are computed on each read (a sample is a few thousand spikes) from a memory-mapped copy of
the file's spikes made on first use, in a child process killed after ``read_timeout`` seconds (libhdf5
can spin on a damaged file; :mod:`snnjax.data.spike_cache`; ``cache=False`` reads the HDF5 file sample by
sample, after a child has read every sample once), on ``num_workers`` threads. ``temporal_delete``
(training split) keeps a sorted random subset of that many of the ``T`` frames per example, keyed as the
other augmentations (:class:`snnjax.data.augment.EventAugment`).
"""
from __future__ import annotations

import copy
import os
import threading
from pathlib import Path

import numpy as np

from snnjax.data.augment import AugmentedFrames, EventAugment
from snnjax.data.events import Events, segment_bounds_by_number
from snnjax.data.frames import FrameSpec, bounds_by_duration, bounds_by_time, count_segments
from snnjax.data.spike_cache import OPTION, SpikeFileError, check_samples, open_checked, spike_arrays
from snnjax.data.workers import Workers
from snnjax.runtime.trial_read import READ_TIMEOUT, check_timeout

NUM_CHANNELS = 700
HEIDELBERG = {  # name -> (classes, splits)
    "shd": (20, ("train", "test")),
    "ssc": (35, ("train", "valid", "test")),
}
_HINT = ("Download {files} from https://zenkelab.org/datasets/ (mirror https://compneuro.net/datasets/) and "
         "unzip them into data_dir.")


def heidelberg_bounds(spec: FrameSpec, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(j_l [T], j_r [T])`` of spike times ``t`` (seconds) under ``spec``, as SpikingJelly's SHD builders."""
    if spec.split_by == "number":
        return segment_bounds_by_number(t.shape[0], spec.time_steps)
    if spec.split_by == "time":
        return bounds_by_time(t, spec.time_steps, exact_division=True)
    ms = 1000 * t
    return bounds_by_duration(ms - ms[0], spec.duration, spec.time_steps)


def integrate_spikes(spec: FrameSpec, times: np.ndarray, units: np.ndarray) -> np.ndarray:
    """One sample's spikes as frames ``[T, 700]`` float32 (counts per channel)."""
    if spec.integrator is not None:
        zeros = np.zeros_like(units)
        frames = np.asarray(spec.integrator(Events(times, units, zeros, zeros), spec.time_steps, 1, NUM_CHANNELS),
                            np.float32)
        if frames.shape != (spec.time_steps, NUM_CHANNELS):
            raise ValueError(f"the custom integrator returned frames of shape {frames.shape}; SHD/SSC frames are "
                             f"{(spec.time_steps, NUM_CHANNELS)} (T, channels)")
        return frames
    j_l, j_r = heidelberg_bounds(spec, times)
    return count_segments(units.astype(np.int64), j_l, j_r, NUM_CHANNELS)


class HeidelbergSource(AugmentedFrames):
    """One SHD/SSC HDF5 file as frames ``[n, T, 700]`` float32.

    Args:
      path: the ``.h5`` file.
      num_classes: 20 (SHD) or 35 (SSC).
      frames: the integration.
      cache_dir: folder for the memory-mapped spike copy (:mod:`snnjax.data.spike_cache`), default beside the file.
      cache: read through that copy (else sample by sample from the HDF5 file).
      augment: applied when the loader passes keys (training); only its ``temporal_delete`` applies to
        ``[T, 700]`` frames, and the examples then hold that many time steps.
      num_workers: threads that read and integrate a batch's samples (1: the caller's thread).
      read_timeout: seconds the first read of the file, in a child process, may take (it checks the file and
        writes the copy, or with ``cache=False`` reads every sample once): libhdf5 can spin on a damaged file.
        None: read in this process, without a bound (files you trust; saves the child's ~0.2 s start).

    Raises (here and on reading a sample):
      ValueError: naming ``path``: not HDF5, datasets missing or of another kind (not variable-length, float
        units), no samples, labels that are not whole numbers or out of range, spike times that are NaN,
        infinite or negative, units outside 0..699; the first read did not finish within ``read_timeout``
        or crashed the HDF5 library.
    """

    def __init__(self, path: Path, num_classes: int, frames: FrameSpec, *,
                 cache_dir: str | os.PathLike | None = None, cache: bool = True,
                 augment: EventAugment | None = None, num_workers: int = 1,
                 read_timeout: float | None = READ_TIMEOUT):
        if augment is not None and augment.spatial:
            raise ValueError(f"{augment} moves pixels, but SHD/SSC frames are [T, 700] channels: only "
                             "temporal_delete applies (data.options / keyword arguments)")
        if read_timeout is not None:
            check_timeout(read_timeout, OPTION)
        self.workers = Workers(num_workers, Path(path).stem)
        self.augment = augment if augment is not None and augment.active else None
        self.path = Path(path)
        self.name = self.path.name
        self._lock = threading.Lock()  # h5py serialises access anyway; one reader at a time
        self._flat = None
        try:
            if cache:
                folder = Path(cache_dir) if cache_dir is not None else self.path.parent
                *self._flat, self.labels = spike_arrays(self.path, folder / f"{self.path.name}.spikes", read_timeout)
            else:
                if read_timeout is not None:
                    check_samples(self.path, read_timeout)
                self._file, self._times, self._units, self.labels = open_checked(self.path)
        except SpikeFileError as err:
            raise ValueError(f"{self.path}: {err}") from err
        if self.labels.min() < 0 or self.labels.max() >= num_classes:
            raise ValueError(f"{self.path}: labels span [{self.labels.min()}, {self.labels.max()}], outside "
                             f"[0, {num_classes})")
        self.spec = frames
        self.num_classes = int(num_classes)
        self._set_steps()

    def _set_steps(self) -> None:
        steps = self.spec.time_steps
        self.time_steps = steps if self.augment is None else self.augment.time_steps(steps)
        self.example_shape = (self.time_steps, NUM_CHANNELS)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def with_frames(self, frames: FrameSpec) -> HeidelbergSource:
        """This file integrated by ``frames`` instead (e.g. a custom integrator)."""
        other = copy.copy(self)
        other.spec = frames
        other._set_steps()
        return other

    def spikes(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample ``index``'s ``(times [N] seconds, units [N])`` as stored."""
        if self._flat is not None:
            times, units, offsets = self._flat
            lo, hi = int(offsets[index]), int(offsets[index + 1])
            times, units = np.asarray(times[lo:hi]), np.asarray(units[lo:hi])
        else:
            with self._lock:
                try:
                    times, units = np.asarray(self._times[index]), np.asarray(self._units[index])
                except Exception as err:  # noqa: BLE001 (h5py's errors for damaged data vary)
                    raise ValueError(f"{self.path}: sample {index} cannot be read ({type(err).__name__}: {err}): the "
                                     "file is corrupt") from err
        if times.shape != units.shape:
            raise ValueError(f"{self.path}: sample {index} has {times.shape[0]} spike times but {units.shape[0]} units")
        if units.size and (units.min() < 0 or units.max() >= NUM_CHANNELS):
            raise ValueError(f"{self.path}: sample {index} has units in [{units.min()}, {units.max()}], outside "
                             f"[0, {NUM_CHANNELS})")
        if times.size and not (np.isfinite(times).all() and times.min() >= 0):
            bad = int(np.count_nonzero(~(np.isfinite(times) & (times >= 0))))
            raise ValueError(f"{self.path}: sample {index} has {bad} NaN, infinite or negative spike times: the file "
                             "is corrupt")
        return times, units

    def frames(self, index: int) -> np.ndarray:
        """Sample ``index`` as frames ``[T, 700]`` float32."""
        times, units = self.spikes(index)
        try:
            return integrate_spikes(self.spec, times, units)
        except ValueError as err:
            raise ValueError(f"{self.path}: sample {index}: {err}") from err


def heidelberg_source(name: str, split: str, *, data_dir: str | os.PathLike | None, time_steps: int = 20,
                      split_by: str | None = None, duration: int | None = None, temporal_delete: int | None = None,
                      num_workers: int = 1, cache_dir: str | os.PathLike | None = None,
                      cache: bool = True, read_timeout: float | None = READ_TIMEOUT) -> HeidelbergSource:
    """SHD (``name="shd"``) or SSC (``"ssc"``) frames ``[n, T, 700]``; ``duration`` in milliseconds;
    ``temporal_delete`` (training split): examples keep that many of the ``T`` frames; ``read_timeout``, the
    other keywords: :class:`HeidelbergSource`."""
    num_classes, splits = HEIDELBERG[name]
    files = ", ".join(f"{name}_{s}.h5.zip" for s in splits)
    if split not in splits:
        raise ValueError(f"{name} split must be one of {splits}, got {split!r}")
    if data_dir is None:
        raise ValueError(f"{name} needs data_dir. {_HINT.format(files=files)}")
    path = Path(data_dir) / f"{name}_{split}.h5"
    if not path.is_file():
        raise FileNotFoundError(f"{name}: {path} not found. {_HINT.format(files=files)}")
    spec = FrameSpec(time_steps=time_steps, split_by=split_by or "number", duration=duration)
    augment = EventAugment(temporal_delete=temporal_delete or 0)
    augment.time_steps(time_steps)
    return HeidelbergSource(path, num_classes, spec, cache_dir=cache_dir, cache=cache,
                            augment=augment if split == "train" else None, num_workers=num_workers,
                            read_timeout=read_timeout)


def shd_source(split: str, *, data_dir: str | os.PathLike | None, time_steps: int = 20,
               split_by: str | None = None, duration: int | None = None, temporal_delete: int | None = None,
               num_workers: int = 1, cache_dir: str | os.PathLike | None = None,
               cache: bool = True, read_timeout: float | None = READ_TIMEOUT) -> HeidelbergSource:
    """SHD (20 classes; splits ``train``, ``test``); keywords as :func:`heidelberg_source`."""
    return heidelberg_source("shd", split, data_dir=data_dir, time_steps=time_steps, split_by=split_by,
                             duration=duration, temporal_delete=temporal_delete, num_workers=num_workers,
                             cache_dir=cache_dir, cache=cache, read_timeout=read_timeout)


def ssc_source(split: str, *, data_dir: str | os.PathLike | None, time_steps: int = 20,
               split_by: str | None = None, duration: int | None = None, temporal_delete: int | None = None,
               num_workers: int = 1, cache_dir: str | os.PathLike | None = None,
               cache: bool = True, read_timeout: float | None = READ_TIMEOUT) -> HeidelbergSource:
    """SSC (35 classes; splits ``train``, ``valid``, ``test``); keywords as :func:`heidelberg_source`."""
    return heidelberg_source("ssc", split, data_dir=data_dir, time_steps=time_steps, split_by=split_by,
                             duration=duration, temporal_delete=temporal_delete, num_workers=num_workers,
                             cache_dir=cache_dir, cache=cache, read_timeout=read_timeout)
