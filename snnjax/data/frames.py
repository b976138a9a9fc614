"""How event streams become ``T`` frames: SpikingJelly's integration modes, and a custom hook.

A :class:`FrameSpec` names one mode; each mode gives segment bounds ``(j_l, j_r)``
(frame ``j`` counts events ``[j_l[j], j_r[j])`` of the stream, in file order):

* ``split_by="number"``: ``T`` frames of equal event count, the last taking the remainder
  (SpikingJelly's ``cal_fixed_frames_number_segment_index``, ``'number'``);
* ``split_by="time"``: ``T`` windows of equal length ``dt = (t[-1] - t[0]) // T`` from ``t[0]``;
  frame ``j`` spans from the first to the last event whose time lies in window ``j``, the last
  frame runs to the end (``'time'``; SHD/SSC divide ``dt`` exactly instead of flooring). An empty
  window is an error here (SpikingJelly fails on it with an ``IndexError``);
* ``split_by="duration"``: frames of ``duration`` time units each from the first event
  (``integrate_events_by_fixed_duration``): a recording gives ``ceil((t[-1] - t[0]) / duration)``
  frames, the last taking every later event. SpikingJelly keeps that variable count and pads
  batches (``pad_sequence_collate``); here the first ``T`` frames are kept and shorter recordings are
  padded with empty frames, so every example is ``[T, ...]``;
* ``integrator``: a Python callable ``(events, T, H, W) -> [T, H, W, 2]`` (SpikingJelly's
  ``custom_integrate_function``); its frames are cached under ``custom_<integrator_name>``.

Counting a segment is a ``bincount`` over (y, x, polarity) positions, channels-last.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from snnjax.data.events import Events, segment_bounds_by_number

SPLIT_MODES = ("number", "time", "duration")
Integrator = Callable[[Events, int, int, int], np.ndarray]


def bounds_by_time(t: np.ndarray, time_steps: int, *, exact_division: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """SpikingJelly's ``split_by='time'`` bounds ``(j_l [T], j_r [T])`` of timestamps ``t [N]``.

    ``exact_division``: ``dt = span / T`` (SHD/SSC) instead of ``span // T`` (DVS datasets);
    arithmetic stays in ``t``'s dtype, as SpikingJelly's.

    Raises:
      ValueError: no events, or a window holding none (a recording shorter than ``T`` time units or
        with a gap longer than a window); choose ``split_by='number'`` or fewer frames.
    """
    n = t.shape[0]
    if n == 0:
        raise ValueError("split_by='time' needs at least one event")
    span = t[-1] - t[0]
    dt = span / time_steps if exact_division else span // time_steps
    j_l = np.zeros(time_steps, np.int64)
    j_r = np.zeros(time_steps, np.int64)
    for i in range(time_steps):
        t_l = dt * i + t[0]
        t_r = t_l + dt
        inside = np.flatnonzero((t >= t_l) & (t < t_r))
        if inside.size == 0:
            raise ValueError(f"split_by='time': window {i} of {time_steps} ([{t_l}, {t_r})) holds no event; the "
                             f"recording spans {span} time units; use split_by='number' or fewer time_steps")
        j_l[i], j_r[i] = inside[0], inside[-1] + 1
    j_r[-1] = n
    return j_l, j_r


def bounds_by_duration(t: np.ndarray, duration: float, time_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-duration bounds of the first ``T`` frames: ``(j_l [T], j_r [T])``, empty past the recording.

    ``t`` is relative to its first event (SpikingJelly subtracts ``t.min()`` for DVS data, ``t[0]``
    for SHD/SSC; the caller does that). Frame ``i < F - 1`` holds events whose ``t // duration == i``
    (found with ``searchsorted`` on file order, as SpikingJelly), frame ``F - 1`` the rest, where
    ``F = ceil(t[-1] / duration)``.

    Raises:
      ValueError: ``F == 0`` (all events at one instant): no frame to put them in.
    """
    n = t.shape[0]
    num_frames = math.ceil(t[-1] / duration) if n else 0
    if num_frames == 0:
        raise ValueError("split_by='duration': the recording spans no time (its last event is at its first "
                         "one's time), so it gives no frame; use split_by='number'")
    index = t // duration
    edges = [0]
    for i in range(num_frames - 1):
        edges.append(int(np.searchsorted(index, i + 1, side="left")))
    edges.append(n)
    j_l = np.full(time_steps, n, np.int64)
    j_r = np.full(time_steps, n, np.int64)
    kept = min(num_frames, time_steps)
    j_l[:kept] = edges[:kept]
    j_r[:kept] = edges[1:kept + 1]
    return j_l, j_r


def count_segments(position: np.ndarray, j_l: np.ndarray, j_r: np.ndarray, size: int) -> np.ndarray:
    """``[T, size]`` float32: frame ``j`` counts the values of ``position[j_l[j]:j_r[j]]`` (each in ``[0, size)``)."""
    frames = np.zeros((j_l.shape[0], size), np.float32)
    for j, (lo, hi) in enumerate(zip(j_l.tolist(), j_r.tolist(), strict=True)):
        if hi > lo:
            frames[j] = np.bincount(position[lo:hi], minlength=size)
    return frames


@dataclasses.dataclass(frozen=True)
class FrameSpec:
    """One way of integrating events into ``time_steps`` frames (see the module docstring).

    Attributes:
      time_steps: ``T``.
      split_by: ``"number"``, ``"time"`` or ``"duration"`` (ignored when ``integrator`` is set).
      duration: time units per frame for ``"duration"`` (the dataset's SpikingJelly unit).
      integrator: optional custom ``(events, T, H, W) -> [T, H, W, 2]``.
      integrator_name: names the custom frames' cache folder (default ``integrator.__name__``).
    """

    time_steps: int
    split_by: str = "number"
    duration: int | None = None
    integrator: Integrator | None = None
    integrator_name: str | None = None

    def __post_init__(self):
        if self.time_steps < 1:
            raise ValueError(f"time_steps must be >= 1, got {self.time_steps}")
        if self.integrator is not None:
            return
        if self.split_by not in SPLIT_MODES:
            raise ValueError(f"split_by must be one of {SPLIT_MODES}, got {self.split_by!r}")
        if self.split_by == "duration" and (self.duration is None or self.duration <= 0):
            raise ValueError(f"split_by='duration' needs a positive duration (data.options.duration), got "
                             f"{self.duration}")
        if self.split_by != "duration" and self.duration is not None:
            raise ValueError(f"duration={self.duration} is only used with split_by='duration', not "
                             f"{self.split_by!r}; set split_by='duration' or unset duration")

    @property
    def cache_name(self) -> str:
        """A folder name unique to these settings."""
        if self.integrator is not None:
            return f"custom_{self.integrator_name or self.integrator.__name__}_T{self.time_steps}"
        if self.split_by == "number":
            return f"frames_T{self.time_steps}"  # the name older caches used
        if self.split_by == "time":
            return f"frames_T{self.time_steps}_time"
        return f"frames_T{self.time_steps}_duration{self.duration}"

    def bounds(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(j_l [T], j_r [T])`` for DVS timestamps ``t [N]`` (SpikingJelly's ``utils`` functions)."""
        if self.split_by == "number":
            return segment_bounds_by_number(t.shape[0], self.time_steps)
        if self.split_by == "time":
            return bounds_by_time(t, self.time_steps)
        return bounds_by_duration(t - t.min(), self.duration, self.time_steps)

    def integrate(self, events: Events, height: int, width: int) -> np.ndarray:
        """``events`` as frames ``[T, height, width, 2]`` float32 (counts; channel 1 is ``p != 0``).

        Raises:
          ValueError: events outside the sensor, a mode that cannot split this stream, or a custom
            integrator returning another shape.
        """
        if self.integrator is not None:
            frames = np.asarray(self.integrator(events, self.time_steps, height, width), np.float32)
            expected = (self.time_steps, height, width, 2)
            if frames.shape != expected:
                raise ValueError(f"the custom integrator {self.integrator_name or self.integrator.__name__} returned "
                                 f"frames of shape {frames.shape}; it must return {expected} (T, H, W, polarity)")
            return frames
        x = np.asarray(events.x).astype(np.int64)
        y = np.asarray(events.y).astype(np.int64)
        p = (np.asarray(events.p) != 0).astype(np.int64)
        if x.size and (x.min() < 0 or x.max() >= width or y.min() < 0 or y.max() >= height):
            raise ValueError(f"event coordinates outside a {height}x{width} frame: "
                             f"x in [{x.min()}, {x.max()}], y in [{y.min()}, {y.max()}]")
        j_l, j_r = self.bounds(np.asarray(events.t))
        frames = count_segments((y * width + x) * 2 + p, j_l, j_r, height * width * 2)
        return frames.reshape(self.time_steps, height, width, 2)
