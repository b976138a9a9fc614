"""Frame integration modes, the frame cache's invalidation and resumable building, event augmentation."""
import math
import os

import numpy as np
import pytest

from snnjax.data.augment import EventAugment, shift_frames
from snnjax.data.events import Events
from snnjax.data.frames import FrameSpec
from snnjax.data.registry import get_source


def events_of(rng, n, t_max=100_000, h=4, w=5):
    return Events(np.sort(rng.integers(0, t_max, n)), rng.integers(0, w, n), rng.integers(0, h, n),
                  rng.integers(0, 2, n))


def loop_by_time(ev, steps, h=4, w=5):
    t = ev.t
    dt = (t[-1] - t[0]) // steps
    frames = np.zeros((steps, h, w, 2))
    bounds = []
    for i in range(steps):
        lo, hi = t[0] + dt * i, t[0] + dt * (i + 1)
        idx = [k for k in range(len(t)) if lo <= t[k] < hi]
        bounds.append([idx[0], idx[-1] + 1])
    bounds[-1][1] = len(t)
    for i, (a, b) in enumerate(bounds):
        for k in range(a, b):
            frames[i, ev.y[k], ev.x[k], ev.p[k]] += 1
    return frames


def loop_by_duration(ev, duration, steps, h=4, w=5):
    t = ev.t - ev.t.min()
    total = math.ceil(t[-1] / duration)
    frames = np.zeros((max(total, steps), h, w, 2))
    for k in range(len(t)):
        frames[min(t[k] // duration, total - 1), ev.y[k], ev.x[k], ev.p[k]] += 1
    return frames[:steps]


@pytest.mark.parametrize("steps", [1, 3, 7])
def test_time_and_duration_modes_match_loops(steps):
    rng = np.random.default_rng(steps)
    ev = events_of(rng, 200)
    np.testing.assert_array_equal(FrameSpec(steps, "time").integrate(ev, 4, 5), loop_by_time(ev, steps))
    for duration in (7_000, 40_000):
        got = FrameSpec(steps, "duration", duration).integrate(ev, 4, 5)
        np.testing.assert_array_equal(got, loop_by_duration(ev, duration, steps))


def test_modes_reject_what_they_cannot_split():
    ev = Events(np.array([0, 0, 50]), np.array([0, 1, 2]), np.zeros(3, int), np.zeros(3, int))
    with pytest.raises(ValueError, match="window 1 of 5.*split_by='number'"):
        FrameSpec(5, "time").integrate(ev, 4, 5)
    with pytest.raises(ValueError, match="positive duration"):
        FrameSpec(2, "duration")
    with pytest.raises(ValueError, match="split_by must be one of"):
        FrameSpec(2, "spikes")
    with pytest.raises(ValueError, match="returned frames of shape"):
        FrameSpec(2, integrator=lambda e, t, h, w: np.zeros((t, 2, h, w))).integrate(ev, 4, 5)


def test_shift_is_pad_and_crop():
    frames = np.arange(2 * 5 * 6 * 2, dtype=np.float32).reshape(2, 5, 6, 2)
    padded = np.pad(frames, ((0, 0), (2, 2), (2, 2), (0, 0)))
    for dy, dx in ((1, -2), (-2, 0), (0, 2)):
        np.testing.assert_array_equal(shift_frames(frames, dy, dx), padded[:, 2 - dy:7 - dy, 2 - dx:8 - dx])
    aug = EventAugment(flip=True, translate=1)
    once = aug(frames, np.random.default_rng([1, 2, 3]))
    np.testing.assert_array_equal(once, aug(frames, np.random.default_rng([1, 2, 3])))


def write_nmnist(root, rng, per_digit=1):
    files = []
    for split in ("Train", "Test"):
        for digit in range(10):
            folder = root / split / str(digit)
            folder.mkdir(parents=True)
            for k in range(per_digit):
                n = 40
                t = np.sort(rng.integers(0, 1 << 20, n))
                rec = np.stack([rng.integers(0, 34, n), rng.integers(0, 34, n), (rng.integers(0, 2, n) << 7)
                                | (t >> 16), (t >> 8) & 0xFF, t & 0xFF], 1).astype(np.uint8)
                (folder / f"{k}.bin").write_bytes(rec.tobytes())
                files.append(folder / f"{k}.bin")
    return files


def test_cache_invalidated_by_file_and_settings_and_resumed(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    files = write_nmnist(tmp_path, rng)
    src = get_source("nmnist", "test", data_dir=tmp_path, time_steps=2)
    built = []
    original = type(src).compute_frames

    def counting(self, index):
        built.append(index)
        return original(self, index)

    monkeypatch.setattr(type(src), "compute_frames", counting)
    src.read([0, 1, 2])  # an interrupted first pass: three examples cached
    src2 = get_source("nmnist", "test", data_dir=tmp_path, time_steps=2)
    src2.prepare(num_workers=2)  # resumes: builds only the other seven
    assert sorted(built) == [0, 1, 2, *range(3, 10)]
    built.clear()
    src2.read(np.arange(10))
    assert built == []
    # the raw file changes (same size, new content and time): rebuilt, with the new frames
    target = src2.files[4]
    data = bytearray(target.read_bytes())
    data[0] = (data[0] + 1) % 34
    target.write_bytes(bytes(data))
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    fresh = src2.read([4])[0]
    assert built == [4]
    np.testing.assert_array_equal(fresh, src2.compute_frames(4)[None])
    # other settings: their own folder
    by_time = get_source("nmnist", "test", data_dir=tmp_path, time_steps=2, split_by="time")
    assert by_time.cache_path(0).is_relative_to(tmp_path / "frames_T2_time")
    by_ms = get_source("nmnist", "test", data_dir=tmp_path, time_steps=2, split_by="duration", duration=1000)
    assert by_ms.cache_path(0).is_relative_to(tmp_path / "frames_T2_duration1000")
    assert len(files) == 20


def test_cache_building_shows_progress(tmp_path, capsys):
    write_nmnist(tmp_path, np.random.default_rng(1))
    get_source("nmnist", "train", data_dir=tmp_path, time_steps=2).prepare(num_workers=1)
    err = capsys.readouterr().err
    assert "nmnist: building frames_T2" in err and "/10 " in err  # a bar over the 10 missing examples
