"""Corrupt event files: a ValueError that names the file and what is wrong, also through the prefetch thread.

Valid files are written in the real formats by ``helpers``' event-file writers;
each case then damages one the way a bad download, a full disk or a wrong file does.
"""
import re
import struct

import numpy as np
import pytest
from helpers import AEDAT_HEADER, aedat_bytes, nmnist_bytes, random_aedat, random_events, write_cifar10dvs

from snnjax.data import Loader
from snnjax.data.cifar10dvs import read_cifar10dvs_aedat
from snnjax.data.event_folder import EventFolderSource
from snnjax.data.events import Events, check_events
from snnjax.data.nmnist import read_nmnist_bin
from snnjax.data.registry import get_source


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


def test_a_reader_that_checks_nothing_still_gets_the_file_named(tmp_path):
    path = tmp_path / "a.ev"
    path.write_bytes(struct.pack("<4i", 0, 50, 1, 1))  # one event (t, x, y, p) with x = 50

    def reader(f):
        return Events(*np.frombuffer(f.read_bytes(), "<i4")[:, None])

    source = EventFolderSource(tmp_path, [path], [0], reader=reader, sensor_size=(16, 16), num_classes=2,
                               time_steps=1, cache=False)
    with pytest.raises(ValueError, match=re.escape(f"{path}: event coordinates outside a 16x16 frame")):
        source.read([0])
