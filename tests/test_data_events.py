"""N-MNIST and CIFAR10-DVS: files written in the real binary formats, decoded and integrated.

Expected values come from straightforward loops written here, independent of
the vectorised library code.
"""
import math

import numpy as np
import pytest
from helpers import AEDAT_HEADER, aedat_bytes, nmnist_bytes, random_aedat, random_events, write_cifar10dvs

from snnjax.data import events as ev
from snnjax.data.cifar10dvs import CIFAR10DVS_CLASS_NAMES, aedat_header_length, read_cifar10dvs_aedat
from snnjax.data.nmnist import read_nmnist_bin
from snnjax.data.registry import get_source

# ----------------------------------------------------------------------------- helpers

def loop_frames(x, y, p, time_steps, height, width):
    """SpikingJelly split_by='number', written as plain loops; channels-last."""
    n = len(x)
    frames = np.zeros((time_steps, height, width, 2), np.float64)
    per = n // time_steps
    for j in range(time_steps):
        lo = j * per
        hi = n if j == time_steps - 1 else (j + 1) * per
        for i in range(lo, hi):
            frames[j, y[i], x[i], 1 if p[i] != 0 else 0] += 1
    return frames


def loop_area_resize(frames, out_h, out_w):
    in_h, in_w = frames.shape[-3:-1]
    out = np.zeros(frames.shape[:-3] + (out_h, out_w, frames.shape[-1]))
    for i in range(out_h):
        r0, r1 = math.floor(i * in_h / out_h), math.ceil((i + 1) * in_h / out_h)
        for j in range(out_w):
            c0, c1 = math.floor(j * in_w / out_w), math.ceil((j + 1) * in_w / out_w)
            out[..., i, j, :] = frames[..., r0:r1, c0:c1, :].mean(axis=(-3, -2))
    return out


def write_nmnist(root, counts_per_digit, seed=0, sizes=None):
    """Writes data_dir/{Train,Test}/<digit>/*.bin; returns {path: (t, x, y, p)}."""
    rng = np.random.default_rng(seed)
    written = {}
    for split in ("Train", "Test"):
        for digit in range(10):
            folder = root / split / str(digit)
            folder.mkdir(parents=True)
            for k in range(counts_per_digit.get(digit, 0)):
                n = int(rng.integers(20, 120)) if sizes is None else sizes
                events = random_events(rng, n, 34, 34)
                path = folder / f"{k:05d}.bin"
                path.write_bytes(nmnist_bytes(*events))
                written[path] = events
    return written


# ----------------------------------------------------------------------------- integration

@pytest.mark.parametrize("n,time_steps", [(100, 7), (3, 5), (0, 4), (16, 16), (17, 1)])
def test_integrate_by_number_matches_loops(n, time_steps):
    rng = np.random.default_rng(n)
    t, x, y, p = random_events(rng, n, 5, 6)
    p = p * rng.integers(1, 3, n)  # any non-zero polarity counts as ON
    frames = ev.integrate_by_number(ev.Events(t, x, y, p), time_steps, 5, 6)
    assert frames.dtype == np.float32 and frames.shape == (time_steps, 5, 6, 2)
    np.testing.assert_array_equal(frames, loop_frames(x, y, p, time_steps, 5, 6))
    assert frames.sum() == n


def test_segment_bounds_follow_spikingjelly():
    j_l, j_r = ev.segment_bounds_by_number(10, 3)
    np.testing.assert_array_equal(j_l, [0, 3, 6])
    np.testing.assert_array_equal(j_r, [3, 6, 10])
    j_l, j_r = ev.segment_bounds_by_number(2, 4)  # fewer events than frames: all in the last
    np.testing.assert_array_equal(j_l, [0, 0, 0, 0])
    np.testing.assert_array_equal(j_r, [0, 0, 0, 2])


def test_integrate_rejects_out_of_frame_events():
    with pytest.raises(ValueError, match="outside"):
        ev.integrate_by_number(ev.Events(*(np.array([v]) for v in (0, 6, 0, 1))), 2, 5, 6)


def test_area_resize_matches_window_means():
    frames = np.random.default_rng(0).poisson(1.0, (2, 13, 10, 2)).astype(np.float32)
    np.testing.assert_allclose(ev.resize_area(frames, 5, 4), loop_area_resize(frames, 5, 4), rtol=1e-6)
    np.testing.assert_allclose(ev.resize_area(frames, 13, 10), frames)


# ----------------------------------------------------------------------------- N-MNIST

def test_nmnist_decoding_roundtrip(tmp_path):
    rng = np.random.default_rng(1)
    t, x, y, p = random_events(rng, 200, 34, 34)
    t[-1] = (1 << 23) - 1  # the largest 23-bit timestamp
    path = tmp_path / "a.bin"
    path.write_bytes(nmnist_bytes(t, x, y, p))
    got = read_nmnist_bin(path)
    for field, want in zip(got, (t, x, y, p), strict=True):
        np.testing.assert_array_equal(field, want)


def test_nmnist_rejects_truncated_file(tmp_path):
    (tmp_path / "bad.bin").write_bytes(b"\x01\x02\x03\x04\x05\x06")
    with pytest.raises(ValueError, match="5-byte"):
        read_nmnist_bin(tmp_path / "bad.bin")


def test_nmnist_source_frames_labels_and_order(tmp_path):
    written = write_nmnist(tmp_path, {0: 2, 3: 1, 9: 2})
    src = get_source("nmnist", "train", data_dir=tmp_path, time_steps=4)
    assert len(src) == 5 and src.num_classes == 10 and src.example_shape == (4, 34, 34, 2)
    assert src.time_steps == 4
    frames, labels = src.read(np.arange(5))
    np.testing.assert_array_equal(labels, [0, 0, 3, 9, 9])
    train_files = sorted((p for p in written if p.parts[-3] == "Train"), key=lambda p: (p.parent.name, p.name))
    for i, path in enumerate(train_files):
        assert src.files[i] == path
        t, x, y, p = written[path]
        np.testing.assert_array_equal(frames[i], loop_frames(x, y, p, 4, 34, 34))
    test_src = get_source("nmnist", "test", data_dir=tmp_path, time_steps=4)
    assert len(test_src) == 5 and not set(test_src.files) & set(src.files)
    test_src.prepare(num_workers=2)  # fills the whole cache
    assert all(test_src.cache_path(i).exists() for i in range(5))


def test_nmnist_cache_hit_and_rebuild(tmp_path, monkeypatch):
    written = write_nmnist(tmp_path, {1: 1, 2: 1})
    src = get_source("nmnist", "train", data_dir=tmp_path, time_steps=3)
    first, _ = src.read([0, 1])
    cache = src.cache_path(0)
    assert cache.exists() and cache.is_relative_to(tmp_path / "frames_T3")

    # A cache hit does not decode the raw file.
    def fail(path):
        raise AssertionError(f"decoded {path} despite a valid cache")
    monkeypatch.setattr(src, "reader", fail)
    np.testing.assert_array_equal(src.read([0, 1])[0], first)
    monkeypatch.undo()

    # Corrupt (garbage), partial (truncated) and stale (source changed) caches are rebuilt.
    good = cache.read_bytes()
    for damage in (b"not a zip file", good[: len(good) // 2]):
        cache.write_bytes(damage)
        np.testing.assert_array_equal(src.read([0])[0][0], first[0])
        assert cache.read_bytes() != damage
    t, x, y, p = (a[:-5] for a in written[src.files[0]])  # rewrite the raw file with fewer events
    src.files[0].write_bytes(nmnist_bytes(t, x, y, p))
    np.testing.assert_array_equal(src.read([0])[0][0], loop_frames(x, y, p, 3, 34, 34))
    assert not list(tmp_path.rglob("*.tmp"))

    # A different T uses its own cache folder; cache=False writes nothing.
    get_source("nmnist", "train", data_dir=tmp_path, time_steps=2).read([0])
    assert (tmp_path / "frames_T2").is_dir()
    get_source("nmnist", "train", data_dir=tmp_path, time_steps=5, cache=False).read([0])
    assert not (tmp_path / "frames_T5").exists()


def test_nmnist_missing_data(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nmnist.*missing"):
        get_source("nmnist", "train", data_dir=tmp_path / "missing")
    (tmp_path / "Train").mkdir()
    with pytest.raises(FileNotFoundError, match="Train"):
        get_source("nmnist", "train", data_dir=tmp_path)
    with pytest.raises(ValueError, match="data_dir"):
        get_source("nmnist", "train")
    with pytest.raises(ValueError, match="split"):
        get_source("nmnist", "val", data_dir=tmp_path)


# ----------------------------------------------------------------------------- CIFAR10-DVS

def test_cifar10dvs_decoding(tmp_path):
    rng = np.random.default_rng(2)
    t, x_raw, y_raw, pol, junk = random_aedat(rng, 300)
    path = tmp_path / "a.aedat"
    path.write_bytes(aedat_bytes(t, x_raw, y_raw, pol, junk))
    assert aedat_header_length(path.read_bytes()) == len(AEDAT_HEADER)
    got = read_cifar10dvs_aedat(path)
    np.testing.assert_array_equal(got.t, t)
    np.testing.assert_array_equal(got.x, 127 - y_raw)  # SpikingJelly's axis swap and flips
    np.testing.assert_array_equal(got.y, 127 - x_raw)
    np.testing.assert_array_equal(got.p, 1 - pol)


def test_cifar10dvs_rejects_odd_word_count(tmp_path):
    (tmp_path / "bad.aedat").write_bytes(AEDAT_HEADER + b"\x80\x00\x00\x01")
    with pytest.raises(ValueError, match="pairs"):
        read_cifar10dvs_aedat(tmp_path / "bad.aedat")


def test_cifar10dvs_split_frames_and_resize(tmp_path):
    counts = [12, 1, 2, 3, 4, 5, 6, 7, 8, 10]
    written = write_cifar10dvs(tmp_path, counts)
    train = get_source("cifar10dvs", "train", data_dir=tmp_path, time_steps=3)
    test = get_source("cifar10dvs", "test", data_dir=tmp_path, time_steps=3)
    every = get_source("cifar10dvs", "all", data_dir=tmp_path, time_steps=3)
    # Per class, the first ceil(0.9 n) files in sorted-name order train, the rest test.
    want_train, want_test = [], []
    for label, name in enumerate(CIFAR10DVS_CLASS_NAMES):
        names = sorted(f"cifar10_{name}_{i}.aedat" for i in range(counts[label]))
        cut = math.ceil(counts[label] * 0.9)
        want_train += [tmp_path / name / f for f in names[:cut]]
        want_test += [tmp_path / name / f for f in names[cut:]]
    assert train.files == want_train and test.files == want_test
    assert len(every) == sum(counts) == len(train) + len(test)
    assert test.files == [tmp_path / "airplane" / "cifar10_airplane_9.aedat",
                          tmp_path / "truck" / "cifar10_truck_9.aedat"]
    frames, labels = test.read([0, 1])
    np.testing.assert_array_equal(labels, [0, 9])
    for i, path in enumerate(test.files):
        label, (t, x_raw, y_raw, pol, _) = written[path]
        want = loop_frames(127 - y_raw, 127 - x_raw, 1 - pol, 3, 128, 128)
        np.testing.assert_array_equal(frames[i], want)
    np.testing.assert_array_equal(train.labels, np.repeat(np.arange(10), [11, 1, 2, 3, 4, 5, 6, 7, 8, 9]))

    half = get_source("cifar10dvs", "train", data_dir=tmp_path, time_steps=3, train_ratio=0.5)
    assert len(half) == sum(math.ceil(c / 2) for c in counts)

    small = get_source("cifar10dvs", "test", data_dir=tmp_path, time_steps=3, size=48)
    assert small.example_shape == (3, 48, 48, 2)
    resized, _ = small.read([0, 1])
    np.testing.assert_allclose(resized, loop_area_resize(frames.astype(np.float64), 48, 48), rtol=1e-6)
    assert small.cache_path(0).is_relative_to(tmp_path / "frames_T3_area48x48")


def test_cifar10dvs_missing_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar10dvs"):
        get_source("cifar10dvs", "train", data_dir=tmp_path / "nope")
    (tmp_path / "airplane").mkdir()
    with pytest.raises(FileNotFoundError, match="automobile"):
        get_source("cifar10dvs", "train", data_dir=tmp_path)
