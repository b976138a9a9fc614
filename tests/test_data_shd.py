"""SHD / SSC: HDF5 files in the release layout, integrated into [T, 700] frames.

Expected frames come from loops over the spikes written here, following SpikingJelly's SHD
builders (number: equal counts; time: exact division of the span; duration: 1000 * t ms).
"""
import math
import os
import re
import time

import numpy as np
import pytest
from helpers import write_shd_h5

from snnjax.data import Loader, spike_cache
from snnjax.data.frames import FrameSpec
from snnjax.data.registry import get_source


def make_samples(rng, n, count=50):
    out = []
    for _ in range(n):
        times = np.sort(rng.uniform(0.01, 0.9, count)).astype(np.float16)
        out.append((times, rng.integers(0, 700, count).astype(np.uint16)))
    return out


def loop_number(units, steps):
    frames = np.zeros((steps, 700))
    per = len(units) // steps
    for i, u in enumerate(units.tolist()):
        frames[min(i // per, steps - 1) if per else steps - 1, u] += 1
    return frames


def loop_time(times, units, steps):
    t = times.astype(np.float16)
    dt = (t[-1] - t[0]) / steps  # float16, as SpikingJelly computes it
    frames = np.zeros((steps, 700))
    firsts = []
    for i in range(steps):
        lo = dt * i + t[0]
        hi = lo + dt
        idx = [k for k in range(len(t)) if lo <= t[k] < hi]
        firsts.append((idx[0], idx[-1] + 1))
    firsts[-1] = (firsts[-1][0], len(t))
    for i, (a, b) in enumerate(firsts):
        for u in units[a:b].tolist():
            frames[i, u] += 1
    return frames


def loop_duration(times, units, duration, steps):
    ms = 1000 * times.astype(np.float16)
    ms = ms - ms[0]
    total = math.ceil(ms[-1] / duration)
    frames = np.zeros((max(total, steps), 700))
    for k in range(len(ms)):
        frames[min(int(ms[k] // duration), total - 1), units[k]] += 1
    return frames[:steps]


def write_shd_dir(root):
    rng = np.random.default_rng(0)
    train, test = make_samples(rng, 6), make_samples(rng, 3, count=9)
    write_shd_h5(root / "shd_train.h5", train, [3, 19, 0, 7, 7, 12])
    write_shd_h5(root / "shd_test.h5", test, [1, 2, 3])
    return root, train, test


@pytest.fixture
def shd_dir(tmp_path):
    """Files of this test's own: it changes them or needs their spike copy not yet made."""
    return write_shd_dir(tmp_path)


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory):
    """Files only read: the tests share their spike copy (made once, in a child process of ~0.3 s)."""
    return write_shd_dir(tmp_path_factory.mktemp("shd"))


def test_frames_by_number_time_and_duration(shared_dir):
    root, train, _ = shared_dir
    src = get_source("shd", "train", data_dir=root, time_steps=4)
    assert src.example_shape == (4, 700) and src.num_classes == 20 and len(src) == 6
    frames, labels = src.read(np.arange(6))
    np.testing.assert_array_equal(labels, [3, 19, 0, 7, 7, 12])
    for i, (_, units) in enumerate(train):
        np.testing.assert_array_equal(frames[i], loop_number(units, 4))
    by_time = get_source("shd", "train", data_dir=root, time_steps=4, split_by="time").read(np.arange(6))[0]
    by_ms = get_source("shd", "train", data_dir=root, time_steps=30, split_by="duration", duration=25)
    ms_frames = by_ms.read(np.arange(6))[0]
    for i, (times, units) in enumerate(train):
        np.testing.assert_array_equal(by_time[i], loop_time(times, units, 4))
        np.testing.assert_array_equal(ms_frames[i], loop_duration(times, units, 25, 30))
    padded = get_source("shd", "train", data_dir=root, time_steps=30, split_by="duration", duration=40)
    for i, (_, units) in enumerate(train):  # at most 23 frames of 40 ms: all spikes kept, then empty frames
        frames = padded.read([i])[0][0]
        assert frames.sum() == len(units) and frames[23:].sum() == 0


def test_custom_integrator_and_resume(shared_dir):
    root, train, _ = shared_dir

    def spike_total(events, steps, height, width):
        frames = np.zeros((steps, width))
        frames[0, np.asarray(events.x)] = 1
        return frames

    src = get_source("shd", "train", data_dir=root, time_steps=2).with_frames(FrameSpec(2, integrator=spike_total))
    frames, _ = src.read([1])
    np.testing.assert_array_equal(np.flatnonzero(frames[0, 0]), np.unique(train[1][1]))
    loader = Loader(get_source("shd", "train", data_dir=root, time_steps=3), 2, seed=1, process_index=0,
                    process_count=1, prefetch=2)
    full = [b for _, b in zip(range(5), loader.batches(), strict=False)]
    resumed = [b for _, b in zip(range(2), loader.batches(start_step=3), strict=False)]
    for a, b in zip(full[3:], resumed, strict=True):
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
    assert full[0]["inputs"].shape == (3, 2, 700)


def test_ssc_splits_and_errors(tmp_path):
    rng = np.random.default_rng(1)
    write_shd_h5(tmp_path / "ssc_valid.h5", make_samples(rng, 2), [34, 0])
    src = get_source("ssc", "valid", data_dir=tmp_path, time_steps=2)
    assert src.num_classes == 35 and len(src) == 2
    with pytest.raises(FileNotFoundError, match="ssc_train.h5.*zenkelab"):
        get_source("ssc", "train", data_dir=tmp_path)
    (tmp_path / "ssc_test.h5").write_bytes(b"not hdf5" * 10)
    with pytest.raises(ValueError, match="ssc_test.h5.*HDF5"):
        get_source("ssc", "test", data_dir=tmp_path)
    write_shd_h5(tmp_path / "shd_train.h5", [(np.array([0.1, 0.1], np.float16), np.array([1, 2], np.uint16))], [0])
    with pytest.raises(ValueError, match="shd_train.h5: sample 0.*split_by='number'"):
        get_source("shd", "train", data_dir=tmp_path, split_by="duration", duration=5).read([0])


def test_spike_copy_matches_hdf5_and_follows_the_file(shd_dir):
    root, train, _ = shd_dir
    cached = get_source("shd", "train", data_dir=root, time_steps=4)
    direct = get_source("shd", "train", data_dir=root, time_steps=4, cache=False)
    here = get_source("shd", "train", data_dir=root, time_steps=4, cache_dir=root / "here", read_timeout=None)
    for folder in (root, root / "here"):
        assert (folder / "shd_train.h5.spikes" / "key.txt").exists()
    for i, (times, units) in enumerate(train):
        for src in (cached, direct, here):
            t, u = src.spikes(i)
            np.testing.assert_array_equal(t, times)
            np.testing.assert_array_equal(u, units)
    rng = np.random.default_rng(5)
    new = make_samples(rng, 2, count=7)
    write_shd_h5(root / "new.h5", new, [1, 2])
    os.replace(root / "new.h5", root / "shd_train.h5")  # the file changes: the copy is rebuilt
    again = get_source("shd", "train", data_dir=root, time_steps=4, cache_dir=str(root))
    assert len(again) == 2
    np.testing.assert_array_equal(again.spikes(1)[1], new[1][1])


@pytest.mark.parametrize(("child", "cache", "reason"), [
    ("import time\ndef read(*args):\n    time.sleep(60)\n", True,
     "reading it did not finish within data.options.read_timeout=0.5 s"),
    ("import os, signal\ndef read(*args):\n    os.kill(os.getpid(), signal.SIGSEGV)\n", False,
     "reading it crashed the HDF5 library (signal 11"),
])
def test_a_file_that_hangs_or_crashes_the_hdf5_library_is_refused(shd_dir, monkeypatch, child, cache, reason):
    """The first read of the file (the copy, or with cache=False every sample once) runs in a child process:
    libhdf5 spins for minutes on some damaged heaps, in native code. Here a child that hangs or crashes as
    libhdf5 did on a fuzzed file; the hang is cut at read_timeout."""
    root, _, _ = shd_dir
    script = root / "child.py"
    script.write_text(child)
    monkeypatch.setattr(spike_cache, "_CHILD", f"{script}:read")
    start = time.monotonic()
    with pytest.raises(ValueError, match=re.escape(f"{root / 'shd_train.h5'}: {reason}")):
        get_source("shd", "train", data_dir=root, time_steps=4, cache=cache, read_timeout=0.5)
    assert time.monotonic() - start < 5


def test_a_damaged_heap_that_makes_libhdf5_spin_is_refused_within_read_timeout(tmp_path):
    """A real one, found by tests/test_fuzz.py: the objects of the file's first global heap collection zeroed make
    libhdf5 (2.0.0 under h5py 3.16) spin in native code reading spikes/times (over 60 s by hand). The child
    reading it is killed at read_timeout; a libhdf5 that refuses the heap instead raises its read error."""
    rng = np.random.default_rng(3)
    path = tmp_path / "shd_train.h5"
    write_shd_h5(path, make_samples(rng, 3, count=6), [0, 5, 19])
    data = bytearray(path.read_bytes())
    start = data.index(b"GCOL") + 16  # the collection's header: signature, version, reserved, size
    data[start:start + 202] = bytes(202)
    path.write_bytes(bytes(data))
    began = time.monotonic()
    with pytest.raises(ValueError, match=re.escape(f"{path}: ") + "(reading it did not finish within "
                       r"data.options.read_timeout=1 s|samples 0..2 cannot be read)"):
        get_source("shd", "train", data_dir=tmp_path, read_timeout=1)
    assert time.monotonic() - began < 5


def test_spike_copy_errors_name_the_option(shared_dir):
    root, _, _ = shared_dir
    with pytest.raises(ValueError, match=re.escape("data.options.read_timeout must be a positive number of seconds, "
                                                   "got 0")):
        get_source("shd", "train", data_dir=root, read_timeout=0)
    (root / "a_file").write_text("")
    with pytest.raises(OSError, match=r"cannot write the spike copy of .*shd_train.h5 in .*a_file.*set "
                                      r"data.options.cache_dir to a writable folder"):
        get_source("shd", "train", data_dir=root, cache_dir=root / "a_file" / "copies")


def test_workers_read_the_same_batches(shared_dir):
    root, _, _ = shared_dir
    batches = []
    for workers, cache in ((1, True), (2, True), (2, False)):
        src = get_source("shd", "train", data_dir=root, time_steps=4, temporal_delete=3, num_workers=workers,
                         cache=cache)
        assert src.workers.count == workers
        loader = Loader(src, 2, seed=3, process_index=0, process_count=1, prefetch=0)
        batches.append([b["inputs"] for b in loader.epoch_batches(1)])
    for other in batches[1:]:
        for a, b in zip(batches[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"num_workers must be an integer >= 1.*data.options.num_workers"):
        get_source("shd", "train", data_dir=root, num_workers=0)
