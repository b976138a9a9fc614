"""Corrupt data files: a ValueError that names the file and what is wrong, also through the prefetch thread.

Valid files are written in the real formats by ``helpers``' event-file writers;
each case then damages one the way a bad download, a full disk or a wrong file does.
"""
import io
import re
import struct
import warnings

import h5py
import numpy as np
import pytest
from helpers import (
    AEDAT31_HEADER,
    AEDAT_HEADER,
    aedat31_event_word,
    aedat31_packet,
    aedat_bytes,
    nmnist_bytes,
    ragged,
    random_aedat,
    random_events,
    write_cifar10dvs,
)
from PIL import Image

from snnjax.data import Loader
from snnjax.data.cifar10dvs import read_cifar10dvs_aedat
from snnjax.data.dvs128_gesture import MAX_TS_OVERFLOW, read_aedat31, read_labels_csv
from snnjax.data.event_folder import EventFolderSource
from snnjax.data.events import Events, check_events
from snnjax.data.image_folder import load_image
from snnjax.data.nmnist import read_nmnist_bin
from snnjax.data.registry import get_source
from snnjax.data.source import OnCorrupt


def valid_aedat(n: int = 200, seed: int = 0) -> bytes:
    return aedat_bytes(*random_aedat(np.random.default_rng(seed), n))


def shuffled_timestamps(content: bytes) -> bytes:
    words = np.frombuffer(content[len(AEDAT_HEADER):], ">u4").reshape(-1, 2).copy()
    words[:, 1] = np.random.default_rng(1).permutation(words[:, 1])
    return AEDAT_HEADER + words.tobytes()


def random_payload(content: bytes) -> bytes:
    """A valid header, then as many random bytes as the events took (the first not text, so the header ends)."""
    return AEDAT_HEADER + b"\x80" + np.random.default_rng(6).bytes(len(content) - len(AEDAT_HEADER) - 1)


AEDAT_CASES = {  # name: (damage, what the error says)
    "random bytes": (lambda b: np.random.default_rng(5).bytes(len(b)), "not an AEDAT file"),
    "no header": (lambda b: b[len(AEDAT_HEADER):], "not an AEDAT file"),
    "another version": (lambda b: b.replace(b"#!AER-DAT2.0", b"#!AER-DAT3.1", 1), "AEDAT version '3.1'"),
    "truncated payload": (lambda b: b[:-3], "not a whole number of"),
    "header only": (lambda b: AEDAT_HEADER, "holds no events"),
    "random payload": (random_payload, "timestamps go backwards between"),
    "words shifted by 4 bytes": (lambda b: AEDAT_HEADER + b[len(AEDAT_HEADER) + 4:] + b"\0\0\0\0",
                                 "timestamps go backwards between"),
    "timestamps out of order": (shuffled_timestamps, "timestamps go backwards between"),
}


def test_a_valid_aedat_file_reads(tmp_path):
    path = tmp_path / "ok.aedat"
    path.write_bytes(valid_aedat())
    assert len(read_cifar10dvs_aedat(path).t) == 200


@pytest.mark.parametrize("case", AEDAT_CASES)
def test_corrupt_aedat_is_named(tmp_path, case):
    damage, reason = AEDAT_CASES[case]
    path = tmp_path / "cat" / "cifar10_cat_7.aedat"
    path.parent.mkdir()
    path.write_bytes(damage(valid_aedat()))
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + re.escape(reason)):
        read_cifar10dvs_aedat(path)


def test_aedat_timestamps_may_go_back_now_and_then(tmp_path):
    """A wrap or reset inside a recording is real data, not corruption."""
    t, x_raw, y_raw, pol, junk = random_aedat(np.random.default_rng(2), 300)
    t[150:] -= t[150]  # one reset to 0
    path = tmp_path / "reset.aedat"
    path.write_bytes(aedat_bytes(t, x_raw, y_raw, pol, junk))
    np.testing.assert_array_equal(read_cifar10dvs_aedat(path).t, t)


def nmnist_file(tmp_path, events):
    path = tmp_path / "00001.bin"
    path.write_bytes(nmnist_bytes(*events))
    return path


def test_corrupt_nmnist_is_named(tmp_path):
    rng = np.random.default_rng(3)
    t, x, y, p = random_events(rng, 100, 34, 34)
    assert len(read_nmnist_bin(nmnist_file(tmp_path, (t, x, y, p))).t) == 100
    cases = {
        "x spans [0, 40], outside [0, 34)": (t, np.where(np.arange(100) == 7, 40, x), y, p),
        "y spans": (t, x, np.where(np.arange(100) == 7, 250, y), p),
        "timestamps go backwards between": (rng.permutation(t), x, y, p),
    }
    for reason, events in cases.items():
        path = nmnist_file(tmp_path, events)
        with pytest.raises(ValueError, match=re.escape(f"{path}: not a valid recording of a 34x34 sensor") + ".*"
                                             + re.escape(reason)):
            read_nmnist_bin(path)
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=re.escape(f"{path}: holds no events")):
        read_nmnist_bin(path)
    path.write_bytes(np.random.default_rng(4).bytes(5 * 200))
    with pytest.raises(ValueError, match=re.escape(str(path))):
        read_nmnist_bin(path)


def test_check_events_reports_every_problem():
    events = Events(t=np.array([5, -1, 3]), x=np.array([0, 1, 9]), y=np.array([0, 1, 2]), p=np.array([0, 2, 1]))
    with pytest.raises(ValueError, match=r"f.bin: not a valid recording of a 4x8 sensor \(3 events\): x spans "
                                         r"\[0, 9\], outside \[0, 8\); polarity spans \[0, 2\], outside \[0, 2\); "
                                         r"timestamps reach -1 < 0; timestamps go backwards between 1 of 2 "
                                         r"consecutive events"):
        check_events("f.bin", events, 4, 8)


def test_a_corrupt_file_is_named_through_the_source_cache_and_prefetch_thread(tmp_path):
    write_cifar10dvs(tmp_path, [2] * 10)
    bad = tmp_path / "cat" / "cifar10_cat_1.aedat"
    bad.write_bytes(np.random.default_rng(9).bytes(bad.stat().st_size))
    source = get_source("cifar10dvs", "all", data_dir=tmp_path, time_steps=2)
    loader = Loader(source, 4, seed=0, shuffle=False, process_index=0, process_count=1, prefetch=2)
    batches = loader.batches()
    with pytest.raises(ValueError, match=re.escape(f"{bad}: not an AEDAT file")):
        for _ in range(loader.steps_per_epoch):
            next(batches)  # batch 1 (examples 4..7) holds cat_1, read in the background thread
    assert not source.cache_path(source.files.index(bad)).exists()  # nothing cached for it
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        source.prepare(num_workers=2)  # the cache builder's threads


@pytest.fixture
def turned_corrupt(tmp_path):
    """CIFAR10-DVS folders (4 files per class) whose file ``cat/cifar10_cat_1.aedat`` turns to random bytes after
    its source was built: ``(source of split "all", the file, its index)``."""
    write_cifar10dvs(tmp_path, [4] * 10, n_events=40)
    source = get_source("cifar10dvs", "all", data_dir=tmp_path, time_steps=2, num_workers=2, cache=False)
    bad = tmp_path / "cat" / "cifar10_cat_1.aedat"
    bad.write_bytes(np.random.default_rng(9).bytes(bad.stat().st_size))
    return source, bad, source.files.index(bad)


def test_a_file_that_turns_out_corrupt_is_skipped(turned_corrupt):
    """on_corrupt="skip": the example's place in its batch goes to the next example of the dataset, with one warning
    naming the file (not again in the next epoch), and the index is counted."""
    source, bad, index = turned_corrupt
    skipping = OnCorrupt(source, "skip", what="cifar10dvs training")
    loader = Loader(skipping, 8, seed=0, shuffle=False, process_index=0, process_count=1, prefetch=0)
    with pytest.warns(RuntimeWarning) as caught:
        epoch = list(loader.epoch_batches(0))
    assert len(caught) == 1 and str(caught[0].message).startswith(
        f"skipping a corrupt cifar10dvs training example (config.data.on_corrupt='skip'): {bad}: not an AEDAT file")
    assert list(skipping.corrupt) == [index]
    step, row = divmod(index, 8)
    inputs, labels = source.read([index + 1])  # [1, T, H, W, 2]; the batches are time-major
    np.testing.assert_array_equal(epoch[step]["inputs"][:, row], inputs[0])
    assert epoch[step]["labels"][row] == labels[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # known now: no second warning
        again = next(iter(loader.epoch_batches(0, start_step=step)))
    np.testing.assert_array_equal(again["inputs"], epoch[step]["inputs"])


def test_a_file_that_turns_out_corrupt_stops_the_read_through_the_workers(turned_corrupt):
    """on_corrupt="error": the reader's error, raised in a worker thread under the prefetch thread, reaches the
    consumer naming the file and the setting that skips it."""
    source, bad, _ = turned_corrupt
    loader = Loader(OnCorrupt(source, "error", what="cifar10dvs training"), 8, seed=0, shuffle=False,
                    process_index=0, process_count=1, prefetch=2)
    with pytest.raises(ValueError, match=re.escape(f"{bad}: not an AEDAT file") + r".*\(a cifar10dvs training "
                                         r"example; config.data.on_corrupt='skip' skips such examples"):
        list(loader.epoch_batches(0))


def test_an_unreadable_dataset_is_not_skipped_file_by_file(tmp_path):
    write_cifar10dvs(tmp_path, [4] * 10, n_events=40)
    source = get_source("cifar10dvs", "all", data_dir=tmp_path, time_steps=2, cache=False)
    for f in source.files:
        f.unlink()
    with pytest.raises(ValueError, match=r"40 cifar10dvs training examples in a row from index 0 fail to read, "
                                         r"which is not a corrupt file but an unreadable dataset; the first error: "):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            OnCorrupt(source, "skip", what="cifar10dvs training").read([0])


def test_a_reader_that_checks_nothing_still_gets_the_file_named(tmp_path):
    path = tmp_path / "a.ev"
    path.write_bytes(struct.pack("<4i", 0, 50, 1, 1))  # one event (t, x, y, p) with x = 50

    def reader(f):
        return Events(*np.frombuffer(f.read_bytes(), "<i4")[:, None])

    source = EventFolderSource(tmp_path, [path], [0], reader=reader, sensor_size=(16, 16), num_classes=2,
                               time_steps=1, cache=False)
    with pytest.raises(ValueError, match=re.escape(f"{path}: event coordinates outside a 16x16 frame")):
        source.read([0])


# ----------------------------------------------------------------------------- hostile headers and payloads

@pytest.mark.parametrize(("payload", "reason"), [
    (b"\xff" * 800, "all timestamps are 4294967295 (a payload of repeated bytes"),
    (b"\x00" * 800, "all timestamps are 0 (a payload of repeated bytes"),
])
def test_aedat2_payloads_of_one_repeated_byte_are_refused(tmp_path, payload, reason):
    path = tmp_path / "cifar10_cat_0.aedat"
    path.write_bytes(AEDAT_HEADER + payload)
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a valid recording") + ".*" + re.escape(reason)):
        read_cifar10dvs_aedat(path)


def test_aedat31_timestamp_overflow_is_bounded(tmp_path):
    path = tmp_path / "user01_led.aedat"
    events = [(aedat31_event_word(i % 128, 3, 1), 100 * i) for i in range(20)]
    for overflow, ok in ((MAX_TS_OVERFLOW, True), (1 << 30, False), (-1, False)):
        path.write_bytes(AEDAT31_HEADER + aedat31_packet(1, events, overflow))
        if ok:
            assert read_aedat31(path).t[0] == MAX_TS_OVERFLOW << 31
            continue
        with pytest.raises(ValueError, match=re.escape(f"{path}: packet at byte 61 has timestamp overflow {overflow}, "
                                                       f"outside [0, {MAX_TS_OVERFLOW}]")):
            read_aedat31(path)


@pytest.mark.parametrize(("rows", "reason"), [
    ("3,5000,1000\n", "row 2 (3,5000,1000) is not a window 0 <= start < end"),
    ("3,-50,1000\n", "row 2 (3,-50,1000) is not a window"),
    ("3,100,100\n", "row 2 (3,100,100) is not a window"),
    ("3,100,900\n4,1000,2000\n3,100,900\n", "row 2 (3,100,900) appears 2 times"),
    ("", "no rows"),
    ("3,1.5,900\n", "not a labels CSV"),
])
def test_gesture_label_windows_are_checked(tmp_path, rows, reason):
    path = tmp_path / "user01_led_labels.csv"
    path.write_text("class,startTime_usec,endTime_usec\n" + rows)
    with pytest.raises(ValueError, match=re.escape(f"{path}: ") + ".*" + re.escape(reason)):
        read_labels_csv(path)


def shd_file(path, times=(0.1, 0.2), units=(1, 2), labels=(0,), *, times_dtype=np.float32, units_dtype=np.uint16,
             labels_dtype=np.uint16, fixed=False):
    """An SHD file of one sample (or none, ``labels=()``), its datasets of the given dtypes."""
    with h5py.File(path, "w") as f:
        for name, values, dtype in (("spikes/times", times, times_dtype), ("spikes/units", units, units_dtype)):
            if fixed:
                f.create_dataset(name, data=np.asarray([values] * len(labels), dtype))
            else:
                f.create_dataset(name, data=ragged([np.asarray(values, dtype)] * len(labels)),
                                 dtype=h5py.vlen_dtype(dtype))
        f.create_dataset("labels", data=np.asarray(labels, labels_dtype))
    return path


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"times": (0.1, np.nan)}, "sample 0 has 1 NaN, infinite or negative spike times"),
    ({"times": (-0.1, 0.2)}, "sample 0 has 1 NaN, infinite or negative spike times"),
    ({"labels": (1.7,), "labels_dtype": np.float32}, "1 labels are not whole numbers (e.g. 1.7"),
    ({"units_dtype": np.float32}, "spikes/units is variable-length float32 of shape (1,); SHD/SSC files hold one "
                                  "variable-length array of integers per sample"),
    ({"fixed": True}, "spikes/times is float32 of shape (1, 2); SHD/SSC files hold one variable-length"),
    ({"labels": ()}, "holds no samples"),
])
def test_shd_files_with_impossible_spikes_or_labels_are_refused(tmp_path, kwargs, reason):
    path = shd_file(tmp_path / "shd_train.h5", **kwargs)
    with pytest.raises(ValueError, match=re.escape(f"{path}: ") + ".*" + re.escape(reason)):
        source = get_source("shd", "train", data_dir=tmp_path, time_steps=2, cache_dir=tmp_path / "cache")
        source.read(np.arange(len(source)))


def jpeg_bytes(width=16, height=16) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def with_size(content: bytes, width: int, height: int) -> bytes:
    """A JPEG whose frame header claims ``width x height`` (the scan data unchanged)."""
    i = content.find(b"\xff\xc0") + 5
    return content[:i] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + content[i + 4:]


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda b: with_size(b, 9000, 9000), "its header claims 9000x9000 pixels from"),
    (lambda b: with_size(b, 65000, 65000), "could be decompression bomb"),
    (lambda b: b[:len(b) * 2 // 3], "Truncated File Read"),
    (lambda b: b[:-2], "the JPEG has no end-of-image marker"),
    (lambda b: b"", "cannot identify image file"),
])
def test_image_bombs_and_truncated_jpegs_are_refused(tmp_path, damage, reason):
    path = tmp_path / "a.JPEG"
    path.write_bytes(jpeg_bytes())
    assert load_image(path, 8, None, False).shape == (8, 8, 3)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=re.escape(f"{path}: cannot decode the image (") + ".*" + re.escape(reason)):
        load_image(path, 8, None, False)
