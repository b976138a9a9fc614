"""DVS128 Gesture (Amir et al. 2017): 11 hand and arm gestures on a 128x128 DVS, jAER AEDAT 3.1.

Layout (the extracted ``DvsGesture.tar.gz``; ``data_dir`` may be the ``DvsGesture`` folder or
the folder holding it)::

    DvsGesture/trials_to_train.txt, trials_to_test.txt   one recording name per line
    DvsGesture/user01_fluorescent.aedat                   one recording (AEDAT 3.1)
    DvsGesture/user01_fluorescent_labels.csv              class,startTime_usec,endTime_usec

AEDAT 3.1 (as SpikingJelly's ``load_aedat_v3``): ASCII header lines starting with ``#``, the
first ``#!AER-DAT3.1``, the last ``#!END-HEADER``; then packets, each a 28-byte little-endian
header (int16 eventType, int16 eventSource, int32 eventSize, int32 eventTSOffset, int32
eventTSOverflow, int32 eventCapacity, int32 eventNumber, int32 eventValid) followed by
``eventCapacity * eventSize`` bytes. Polarity packets (type 1, 8-byte events) hold a uint32
``data`` word and an int32 timestamp: ``valid = data & 1``, ``p = (data >> 1) & 1``,
``y = (data >> 2) & 0x7FFF``, ``x = (data >> 17) & 0x7FFF``, ``t = timestamp | overflow << 31``
(microseconds). Other packet types are skipped. SpikingJelly keeps events whose validity bit is
0, and so does :func:`read_aedat31` unless asked (``valid_only=True``).

Samples, as SpikingJelly's ``DVS128Gesture``: each CSV row ``(class, start, end)`` of a
recording is one sample, the recording's events with ``start <= t < end``, label ``class - 1``
(0..10); rows of one class in one recording are numbered ``k = 0, 1, ...`` and the sample is named
``<recording>_<k>``. ``"train"`` / ``"test"`` take the recordings listed in
``trials_to_train.txt`` / ``trials_to_test.txt`` (SpikingJelly's documentation counts 1176 / 288
samples in the release). Examples are ordered by label, then by sample file name
(``<recording>_<k>.npz``, as SpikingJelly's folders list them).

Labels here are the gesture index ``class - 1``. SpikingJelly's ``DatasetFolder`` sorts its class
folders ``0`` .. ``10`` as strings, so its label ``2`` is gesture ``10`` (class 11) and its
labels ``3`` .. ``10`` are gestures ``2`` .. ``9``; :data:`SPIKINGJELLY_LABEL` maps ours to its.
"""
from __future__ import annotations

import collections
import os
import struct
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from snnjax.data.event_folder import EventFolderSource, dataset_root, event_settings
from snnjax.data.events import Events, check_events

GESTURE_SIZE = (128, 128)
NUM_GESTURES = 11
# Our label -> the label SpikingJelly's DatasetFolder gives (class folders sorted as strings).
SPIKINGJELLY_LABEL = tuple(sorted(str(i) for i in range(NUM_GESTURES)).index(str(i)) for i in range(NUM_GESTURES))
AEDAT3_MAGIC = b"#!AER-DAT3"
END_HEADER = b"#!END-HEADER\r\n"
PACKET_HEADER = struct.Struct("<hhiiiiii")  # type, source, size, tsoffset, tsoverflow, capacity, number, valid
POLARITY_EVENT = 1
MAX_TS_OVERFLOW = 1 << 12  # timestamp wraps (2^31 us, 36 min each) a recording may start after: 100 days
_SPLIT_FILES = {"train": "trials_to_train.txt", "test": "trials_to_test.txt"}
_HINT = ("Download DvsGesture.tar.gz (IBM, https://ibm.ent.box.com/s/3hiq58ww1pbbjrinh367ykfdf60xsfm8/folder/"
         "50167556794) and extract it so that data_dir/DvsGesture/ holds trials_to_train.txt, trials_to_test.txt, "
         "user*_*.aedat and user*_*_labels.csv.")


def read_aedat31(path: str | os.PathLike, *, valid_only: bool = False) -> Events:
    """Decodes a jAER AEDAT 3.1 file's polarity events into int64 :class:`Events` (``t`` in microseconds).

    Args:
      valid_only: drop events whose validity bit is 0 (SpikingJelly keeps them).

    Raises:
      ValueError: naming ``path``: not AEDAT 3.x, no end of header, a truncated packet, polarity
        events of another size, a timestamp overflow over :data:`MAX_TS_OVERFLOW`, or events that cannot be a
        128x128 recording (``check_events``).
    """
    content = Path(path).read_bytes()
    if not content.startswith(AEDAT3_MAGIC):
        first = content[:content.find(b"\n")][:40]
        raise ValueError(f"{path}: not an AEDAT 3.x file: the first line should be {AEDAT3_MAGIC.decode()}.1, found "
                         f"{first!r}. The file is corrupt or of another format; replace it")
    end = content.find(END_HEADER)
    if end < 0:
        raise ValueError(f"{path}: the header has no {END_HEADER!r} line: the file is truncated or corrupt")
    pos = end + len(END_HEADER)
    words = []
    overflows = []
    while pos < len(content):
        if pos + PACKET_HEADER.size > len(content):
            raise ValueError(f"{path}: truncated packet header at byte {pos}: the file is truncated or corrupt")
        kind, _, size, _, overflow, capacity, _, _ = PACKET_HEADER.unpack_from(content, pos)
        pos += PACKET_HEADER.size
        length = capacity * size
        if size < 0 or capacity < 0 or pos + length > len(content):
            raise ValueError(f"{path}: packet at byte {pos - PACKET_HEADER.size} declares {capacity} events of {size} "
                             f"bytes, past the end of the file: the file is truncated or corrupt")
        if kind == POLARITY_EVENT:
            if not 0 <= overflow <= MAX_TS_OVERFLOW:
                raise ValueError(f"{path}: packet at byte {pos - PACKET_HEADER.size} has timestamp overflow "
                                 f"{overflow}, outside [0, {MAX_TS_OVERFLOW}] (timestamps of {overflow} x 2^31 us): "
                                 "the file is corrupt")
            if size != 8:
                raise ValueError(f"{path}: polarity events of {size} bytes at byte {pos}; AEDAT 3.1 polarity "
                                 "events are 8 bytes: the file is corrupt")
            words.append(np.frombuffer(content, "<u4", capacity * 2, pos).reshape(capacity, 2))
            overflows.append(np.full(capacity, overflow, np.int64))
        pos += length
    if words:
        data = np.concatenate(words).astype(np.int64)
        overflow = np.concatenate(overflows)
    else:
        data, overflow = np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
    address, stamp = data[:, 0], data[:, 1]
    if valid_only:
        keep = (address & 1) == 1
        address, stamp, overflow = address[keep], stamp[keep], overflow[keep]
    events = Events(t=stamp | (overflow << 31), x=(address >> 17) & 0x7FFF, y=(address >> 2) & 0x7FFF,
                    p=(address >> 1) & 1)
    return check_events(path, events, *GESTURE_SIZE)


def read_labels_csv(path: Path) -> np.ndarray:
    """``[rows, 3]`` int64 ``(class 1..11, start_us, end_us)`` of a ``*_labels.csv`` (header line skipped).

    Raises:
      ValueError: naming ``path``: not three integer columns, a class outside 1..11, no rows, a window that is
        negative or empty (``end <= start``), or a repeated row.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": the error below says so
            rows = np.loadtxt(path, dtype=np.int64, delimiter=",", skiprows=1, ndmin=2)
    except ValueError as err:
        raise ValueError(f"{path}: not a labels CSV of rows 'class,startTime_usec,endTime_usec' ({err})") from err
    if not rows.size:
        raise ValueError(f"{path}: no rows 'class,startTime_usec,endTime_usec': the labels file is empty or truncated")
    if rows.shape[1] != 3 or (rows[:, 0].min() < 1 or rows[:, 0].max() > NUM_GESTURES):
        raise ValueError(f"{path}: expected rows 'class,startTime_usec,endTime_usec' with class in 1..{NUM_GESTURES}")
    problems = []
    for i, (cls, start, end) in enumerate(rows.tolist()):
        if start < 0 or end <= start:
            problems.append(f"row {i + 2} ({cls},{start},{end}) is not a window 0 <= start < end")
    _, first, counts = np.unique(rows, axis=0, return_index=True, return_counts=True)
    problems += [f"row {i + 2} ({','.join(map(str, rows[i]))}) appears {c} times"
                 for i, c in zip(first, counts, strict=True) if c > 1]
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems[:3])}{' ...' if len(problems) > 3 else ''}: the labels file is "
                         "corrupt; replace it from the release")
    return rows


class DVS128GestureSource(EventFolderSource):
    """DVS128 Gesture samples as frames ``[n, T, h, w, 2]``; see the module docstring.

    Args:
      root: the ``DvsGesture`` folder.
      samples: ``(recording path, start_us, end_us, label, name)`` per example, in dataset order.
      kwargs: :class:`EventFolderSource`'s keywords from ``frames`` on.
    """

    def __init__(self, root: Path, samples: list[tuple[Path, int, int, int, str]], **kwargs):
        super().__init__(root, [s[0] for s in samples], [s[3] for s in samples], reader=read_aedat31,
                         sensor_size=GESTURE_SIZE, num_classes=NUM_GESTURES, name="dvs128_gesture", **kwargs)
        self.samples = samples
        self._by_recording: dict[Path, list[int]] = collections.defaultdict(list)
        for i, sample in enumerate(samples):
            self._by_recording[sample[0]].append(i)
        self._recordings: collections.OrderedDict[Path, Events] = collections.OrderedDict()
        self._recordings_lock = threading.Lock()

    def _recording(self, path: Path) -> Events:
        with self._recordings_lock:
            if path in self._recordings:
                self._recordings.move_to_end(path)
                return self._recordings[path]
        events = read_aedat31(path)
        with self._recordings_lock:
            self._recordings[path] = events
            while len(self._recordings) > self.num_workers + 1:
                self._recordings.popitem(last=False)
        return events

    def events(self, index: int) -> Events:
        path, start, end, _, _ = self.samples[index]
        events = self._recording(path)
        inside = (events.t >= start) & (events.t < end)
        return Events(*(a[inside] for a in events))

    def cache_path(self, index: int) -> Path:
        _, _, _, label, name = self.samples[index]
        return self.cache_root / str(label) / f"{name}.npz"

    def cache_key(self, index: int) -> str:
        _, start, end, _, _ = self.samples[index]
        return f"{super().cache_key(index)};window={start},{end}"

    def _build(self, index: int) -> np.ndarray:
        """Caches every uncached sample of ``index``'s recording while it is decoded (shuffled reads would
        otherwise decode a recording once per sample)."""
        recording = self.samples[index][0]
        siblings = [i for i in self._by_recording[recording]
                    if i == index or not self.cache_path(i).exists()]
        result = None
        for i in siblings:
            frames = self.compute_frames(i)
            self._save(i, frames)
            if i == index:
                result = frames
        return result

    def _build_order(self) -> list[int]:
        return sorted(range(len(self)), key=lambda i: str(self.samples[i][0]))


def gesture_samples(root: Path, split: str) -> list[tuple[Path, int, int, int, str]]:
    """The split's samples ``(recording, start_us, end_us, label, name)`` in dataset order."""
    listing = root / _SPLIT_FILES[split]
    if not listing.is_file():
        raise FileNotFoundError(f"dvs128_gesture: {listing} not found. {_HINT}")
    names = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    missing = [n for n in names if not (root / n).is_file()]
    missing += [f"{Path(n).stem}_labels.csv" for n in names if not (root / f"{Path(n).stem}_labels.csv").is_file()]
    if missing:
        raise FileNotFoundError(f"dvs128_gesture: {len(missing)} file(s) that {listing.name} names are missing from "
                                f"{root}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. {_HINT}")
    samples = []
    for name in names:
        stem = Path(name).stem
        per_label = [0] * NUM_GESTURES
        for cls, start, end in read_labels_csv(root / f"{stem}_labels.csv").tolist():
            label = cls - 1
            samples.append((root / name, start, end, label, f"{stem}_{per_label[label]}"))
            per_label[label] += 1
    return sorted(samples, key=lambda s: (s[3], f"{s[4]}.npz"))


def dvs128_gesture_source(split: str, *, data_dir: str | os.PathLike | None, time_steps: int = 16,
                          size: int | None = None, **options: Any) -> DVS128GestureSource:
    """DVS128 Gesture frames ``[n, T, h, w, 2]`` (event counts), labels 0..10.

    Args:
      split: ``"train"`` or ``"test"``.
      data_dir: the ``DvsGesture`` folder, or the folder holding it.
      time_steps: ``T``.
      size: area-resize frames to ``size x size`` (None: 128x128).
      options: the event datasets' keywords, :data:`snnjax.data.event_folder.EVENT_OPTIONS`: ``split_by``
        (``"number"``, the default, ``"time"`` or ``"duration"``, with ``duration`` in microseconds), the
        training augmentations ``flip``, ``translate``, ``crop_scale``, ``roll``, ``rotate``, ``cutout``, ``nda``,
        ``temporal_delete``, off by default (:class:`~snnjax.data.augment.EventAugment`; ``temporal_delete`` keeps
        that many of the ``T`` frames, so training examples are ``[temporal_delete, h, w, 2]``, the test split
        keeping all ``T``), ``num_workers`` (threads decoding a batch), ``cache_dir`` and ``cache`` (see
        :class:`EventFolderSource`).

    A custom integrator: ``dvs128_gesture_source(...).with_frames(FrameSpec(T, integrator=f))``.
    """
    if split not in _SPLIT_FILES:
        raise ValueError(f"dvs128_gesture split must be one of {tuple(_SPLIT_FILES)}, got {split!r}")
    settings = event_settings("dvs128_gesture", split, time_steps, options)  # options checked first
    root = dataset_root("dvs128_gesture", data_dir, _HINT, "DvsGesture")
    return DVS128GestureSource(root, gesture_samples(root, split), size=size, **settings)
