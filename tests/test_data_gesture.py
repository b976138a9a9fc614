"""DVS128 Gesture: AEDAT 3.1 files and label CSVs written here event by event, decoded and split.

Expected values are computed in this file with plain loops over the events it wrote.
"""

import numpy as np
import pytest
from helpers import AEDAT31_HEADER, aedat31_event_word, aedat31_packet

from snnjax.data import Loader
from snnjax.data import dvs128_gesture as gesture
from snnjax.data.dvs128_gesture import SPIKINGJELLY_LABEL, read_aedat31
from snnjax.data.registry import get_source


def write_recording(folder, name, windows, rng, per_window=40, overflow_from=None):
    """Writes ``name.aedat`` (two polarity packets per window and a foreign packet) and its labels CSV.

    Returns the list of (t, x, y, p, valid) written, in file order.
    """
    written = []
    body = b""
    for _, start, end in windows:
        t = np.sort(rng.integers(start, end, per_window))
        for half in (t[: per_window // 2], t[per_window // 2:]):
            events = []
            overflow = int(half[0] >> 31)
            for ti in half.tolist():
                x, y, p, v = (int(rng.integers(0, 128)), int(rng.integers(0, 128)), int(rng.integers(0, 2)),
                              int(rng.random() < 0.9))
                events.append((aedat31_event_word(x, y, p, v), ti & 0x7FFFFFFF))
                written.append((ti, x, y, p, v))
            body += aedat31_packet(1, events, overflow)
        body += aedat31_packet(2, [(0xFFFFFFFF, 5)], 0)  # a special-event packet: skipped
    (folder / f"{name}.aedat").write_bytes(AEDAT31_HEADER + body)
    csv = "class,startTime_usec,endTime_usec\n" + "".join(f"{c},{s},{e}\n" for c, s, e in windows)
    (folder / f"{name}_labels.csv").write_text(csv)
    return written


def make_release(tmp_path, rng):
    root = tmp_path / "DvsGesture"
    root.mkdir()
    train = {"user01_fluorescent": [(1, 1000, 5000), (11, 6000, 9000), (3, 9500, 12000), (3, 13000, 15000)],
             "user01_led": [(2, 100, 3000), (5, 3100, 8000)]}
    test = {"user24_lab": [(11, (1 << 31) + 10, (1 << 31) + 4000), (4, (1 << 31) + 5000, (1 << 31) + 9000)]}
    written = {name: write_recording(root, name, w, rng) for name, w in {**train, **test}.items()}
    (root / "trials_to_train.txt").write_text("".join(f"{n}.aedat\n" for n in train) + "\n")
    (root / "trials_to_test.txt").write_text("".join(f"{n}.aedat\n" for n in test))
    return root, train, test, written


def loop_counts(events, time_steps):
    """Channels-last counts of ``events`` (t, x, y, p) in ``time_steps`` frames of equal number (SpikingJelly)."""
    frames = np.zeros((time_steps, 128, 128, 2))
    n = len(events)
    per = n // time_steps
    for i, (_, x, y, p, _) in enumerate(events):
        frame = min(i // per, time_steps - 1) if per else time_steps - 1
        frames[frame, y, x, p] += 1
    return frames


def test_aedat31_decodes_packets_overflow_and_validity(tmp_path):
    rng = np.random.default_rng(0)
    written = write_recording(tmp_path, "rec", [(1, 10, 500), (2, (1 << 31) + 3, (1 << 31) + 900)], rng)
    events = read_aedat31(tmp_path / "rec.aedat")
    for field, column in zip(("t", "x", "y", "p"), range(4), strict=True):
        np.testing.assert_array_equal(getattr(events, field), [w[column] for w in written])
    valid = read_aedat31(tmp_path / "rec.aedat", valid_only=True)
    np.testing.assert_array_equal(valid.t, [w[0] for w in written if w[4]])


def test_samples_labels_order_and_frames(tmp_path):
    rng = np.random.default_rng(1)
    root, train, test, written = make_release(tmp_path, rng)
    src = get_source("dvs128_gesture", "train", data_dir=tmp_path, time_steps=3, cache=False)
    expected = []  # (label, file name, events) as SpikingJelly names its sample files
    for name, windows in train.items():
        per_label = [0] * 11
        for cls, start, end in windows:
            inside = [w for w in written[name] if start <= w[0] < end]
            expected.append((cls - 1, f"{name}_{per_label[cls - 1]}.npz", inside))
            per_label[cls - 1] += 1
    expected.sort(key=lambda e: (e[0], e[1]))
    assert len(src) == len(expected) == 6 and src.num_classes == 11
    frames, labels = src.read(np.arange(len(src)))
    np.testing.assert_array_equal(labels, [e[0] for e in expected])
    assert [src.cache_path(i).name for i in range(len(src))] == [e[1] for e in expected]
    for i, (_, _, events) in enumerate(expected):
        np.testing.assert_array_equal(frames[i], loop_counts(events, 3))
    test_src = get_source("dvs128_gesture", "test", data_dir=root, time_steps=2, cache=False)
    assert sorted(test_src.read(np.arange(2))[1].tolist()) == [3, 10]
    assert frames.shape == (6, 3, 128, 128, 2)


def test_spikingjelly_label_map():
    # SpikingJelly's folders sorted as strings: '0', '1', '10', '2', ..., '9'
    assert SPIKINGJELLY_LABEL[10] == 2 and SPIKINGJELLY_LABEL[2] == 3 and SPIKINGJELLY_LABEL[1] == 1


def test_missing_and_corrupt_files_are_named(tmp_path):
    rng = np.random.default_rng(2)
    root, *_ = make_release(tmp_path, rng)
    with pytest.raises(FileNotFoundError, match="trials_to_train"):
        get_source("dvs128_gesture", "train", data_dir=tmp_path / "nowhere")
    (root / "user01_led_labels.csv").unlink()
    with pytest.raises(FileNotFoundError, match="user01_led_labels.csv.*DvsGesture.tar.gz"):
        get_source("dvs128_gesture", "train", data_dir=tmp_path)
    (root / "user24_lab.aedat").write_bytes(AEDAT31_HEADER + b"\x01\x00" * 20)
    src = get_source("dvs128_gesture", "test", data_dir=tmp_path, cache=False)
    with pytest.raises(ValueError, match="user24_lab.aedat.*truncated"):
        src.read([0])
    (root / "user24_lab.aedat").write_bytes(np.random.default_rng(0).bytes(400))
    with pytest.raises(ValueError, match="user24_lab.aedat.*not an AEDAT 3"):
        src.read([0])


def test_cache_and_augmented_resume(tmp_path):
    rng = np.random.default_rng(3)
    make_release(tmp_path, rng)
    src = get_source("dvs128_gesture", "train", data_dir=tmp_path, time_steps=2, size=32, flip=True, translate=4,
                     num_workers=2, cache_dir=str(tmp_path / "cache"))
    loader = Loader(src, 2, seed=5, process_index=0, process_count=1, prefetch=0)
    full = [b for _, b in zip(range(7), loader.batches(), strict=False)]
    resumed = [b for _, b in zip(range(3), loader.batches(start_step=4), strict=False)]
    for a, b in zip(full[4:], resumed, strict=True):
        for key in ("inputs", "labels", "mask"):
            np.testing.assert_array_equal(a[key], b[key])
    assert full[0]["inputs"].shape == (2, 2, 32, 32, 2)
    plain = get_source("dvs128_gesture", "train", data_dir=tmp_path, time_steps=2, size=32,
                       cache_dir=str(tmp_path / "cache"))
    assert len(list((tmp_path / "cache" / "frames_T2_area32x32").rglob("*.npz"))) == len(src)
    raw, _ = plain.read(loader.step_indices(0, 0)[0])
    assert not np.array_equal(raw, full[0]["inputs"].swapaxes(0, 1))  # augmented


def test_one_decode_caches_every_sample_of_a_recording(tmp_path, monkeypatch):
    make_release(tmp_path, np.random.default_rng(4))
    decoded = []
    original = gesture.read_aedat31
    monkeypatch.setattr(gesture, "read_aedat31", lambda path, **kw: decoded.append(path.name) or original(path, **kw))
    src = get_source("dvs128_gesture", "train", data_dir=tmp_path, time_steps=2, num_workers=1)
    src.read(np.arange(len(src))[::-1])  # reversed: samples of the two recordings interleave
    assert sorted(decoded) == ["user01_fluorescent.aedat", "user01_led.aedat"]
    assert all(src.cache_path(i).exists() for i in range(len(src)))
