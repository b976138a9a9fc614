"""Event streams and their integration into frames (SpikingJelly's ``split_by='number'``).

An event stream is four equal-length arrays ``t`` (timestamps, microseconds),
``x`` (column), ``y`` (row), ``p`` (polarity). Integration into ``T`` frames
follows SpikingJelly's ``cal_fixed_frames_number_segment_index`` and
``integrate_events_by_fixed_frames_number`` with ``split_by='number'``:
with ``N`` events and ``di = N // T``, frame ``j`` integrates the events with
indices ``[j * di, (j + 1) * di)``, and the last frame takes everything from
``(T - 1) * di`` to ``N`` (the remainder). Each frame counts events per
(polarity, y, x); channel 0 counts ``p == 0``, channel 1 counts ``p != 0``.
Unlike SpikingJelly's ``[T, 2, H, W]`` the result here is channels-last
``[T, H, W, 2]``.

File readers pass what they decode through :func:`check_events`, so a corrupt
file raises an error naming it instead of becoming frames of noise.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

# A recording is in time order except at rare timestamp wraps or resets; random or misaligned bytes
# decode to timestamps that go backwards between about half of all consecutive events.
MAX_BACKWARD_FRACTION = 0.1


class Events(NamedTuple):
    """An event stream; all fields are 1-D arrays of the same length ``N``."""

    t: np.ndarray  # timestamps (microseconds)
    x: np.ndarray  # column, in [0, W)
    y: np.ndarray  # row, in [0, H)
    p: np.ndarray  # polarity, 0 (OFF) or 1 (ON)


def check_events(path: str | os.PathLike, events: Events, height: int, width: int) -> Events:
    """``events`` decoded from ``path`` if they can be a recording of a ``height x width`` sensor.

    Checks that there is at least one event, that ``x`` lies in ``[0, width)``, ``y`` in
    ``[0, height)`` and ``p`` in ``{0, 1}``, and that timestamps are non-negative, not all equal, and go backwards
    between at most :data:`MAX_BACKWARD_FRACTION` of consecutive events (real recordings may
    wrap or reset now and then, so order is not required outright).

    Raises:
      ValueError: naming ``path`` and what is wrong (a corrupt, truncated or foreign file).
    """
    t, x, y, p = (np.asarray(a).astype(np.int64) for a in events)
    n = t.shape[0]
    if not n:
        raise ValueError(f"{path}: holds no events (an empty or truncated recording); replace or remove the file")
    problems = []
    for name, values, size in (("x", x, width), ("y", y, height), ("polarity", p, 2)):
        if values.min() < 0 or values.max() >= size:
            problems.append(f"{name} spans [{values.min()}, {values.max()}], outside [0, {size})")
    if t.min() < 0:
        problems.append(f"timestamps reach {t.min()} < 0")
    if n > 1 and t.min() == t.max():
        problems.append(f"all timestamps are {t[0]} (a payload of repeated bytes, not a recording)")
    backward = int(np.count_nonzero(np.diff(t) < 0))
    if backward > MAX_BACKWARD_FRACTION * (n - 1):
        problems.append(f"timestamps go backwards between {backward} of {n - 1} consecutive events")
    if problems:
        raise ValueError(f"{path}: not a valid recording of a {height}x{width} sensor ({n} events): "
                         f"{'; '.join(problems)}. The file is corrupt or of another format; replace or remove it")
    return events


def segment_bounds_by_number(num_events: int, time_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """``(j_l [T], j_r [T])``: frame ``j`` integrates events ``[j_l[j], j_r[j])`` (SpikingJelly, 'number')."""
    if time_steps < 1:
        raise ValueError(f"time_steps must be >= 1, got {time_steps}")
    di = num_events // time_steps
    j_l = np.arange(time_steps, dtype=np.int64) * di
    j_r = j_l + di
    j_r[-1] = num_events
    return j_l, j_r


def integrate_by_number(events: Events, time_steps: int, height: int, width: int) -> np.ndarray:
    """Integrates ``events`` into ``T`` frames of equal event count.

    Returns:
      float32 ``[T, H, W, 2]``: event counts per frame, row, column and
      polarity channel (0: ``p == 0``, 1: ``p != 0``).
    """
    x = np.asarray(events.x).astype(np.int64)
    y = np.asarray(events.y).astype(np.int64)
    p = (np.asarray(events.p) != 0).astype(np.int64)
    n = x.shape[0]
    if not (y.shape[0] == n and p.shape[0] == n):
        raise ValueError(f"event fields differ in length: x {x.shape}, y {y.shape}, p {p.shape}")
    if n and (x.min() < 0 or x.max() >= width or y.min() < 0 or y.max() >= height):
        raise ValueError(f"event coordinates outside a {height}x{width} frame: "
                         f"x in [{x.min()}, {x.max()}], y in [{y.min()}, {y.max()}]")
    j_l, _ = segment_bounds_by_number(n, time_steps)
    # Frame of event i: the last j with j_l[j] <= i (j_l is non-decreasing; ties go to the last frame,
    # which is where SpikingJelly puts all events when N < T, since then all j_l = 0).
    frame = np.searchsorted(j_l, np.arange(n), side="right") - 1
    flat = ((frame * height + y) * width + x) * 2 + p
    counts = np.bincount(flat, minlength=time_steps * height * width * 2)
    return counts.reshape(time_steps, height, width, 2).astype(np.float32)


def area_resize_matrix(in_size: int, out_size: int) -> np.ndarray:
    """``[out, in]`` averaging weights of area interpolation (``torch`` ``mode='area'``).

    Output cell ``i`` is the mean of input cells ``[floor(i * in / out), ceil((i + 1) * in / out))``,
    as in ``torch.nn.functional.adaptive_avg_pool2d``.
    """
    weights = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        start = (i * in_size) // out_size
        end = -((-(i + 1) * in_size) // out_size)
        weights[i, start:end] = 1.0 / (end - start)
    return weights


def resize_area(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """Area-resizes ``frames [..., H, W, C]`` to ``[..., height, width, C]`` (float32).

    Each output pixel is the mean event count over its input window
    (``F.interpolate(x, size, mode='area')`` on SpikingJelly's ``[T, 2, H, W]``).
    """
    frames = np.asarray(frames)
    rows = area_resize_matrix(frames.shape[-3], height)
    cols = area_resize_matrix(frames.shape[-2], width)
    out = np.einsum("oh,...hwc,pw->...opc", rows, frames.astype(np.float64), cols, optimize=True)
    return out.astype(np.float32)
