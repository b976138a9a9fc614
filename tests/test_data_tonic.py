"""tonic as a source: tonic's readers give snnjax's readers' events on files written here (N-MNIST, DVS128 Gesture's
AEDAT 3.1, SHD), and a tonic N-MNIST dataset with ToFrame and tonic transforms trains through the training program.

The differences, asserted: tonic reads an AEDAT 3.1 file's every packet as polarity events and drops the packets'
timestamp overflow (``eventTSOverflow``), so it returns special-event packets' words as events and timestamps
past 2^31 us wrapped; it gives SHD's spike times as whole microseconds, truncated (snnjax keeps the stored seconds).
"""
import json

import numpy as np
import pytest
import tonic
from helpers import AEDAT31_HEADER, aedat31_event_word, aedat31_packet, nmnist_bytes, random_events, write_shd_h5

from snnjax.data import Loader, tonic_source
from snnjax.data.dvs128_gesture import read_aedat31
from snnjax.data.nmnist import read_nmnist_bin
from snnjax.data.registry import get_source
from snnjax.models.registry import model_config
from snnjax.train import config as config_lib
from snnjax.train import train_and_evaluate


def write_nmnist(save_to, rng, per_digit):
    """tonic's N-MNIST layout, ``save_to/NMNIST/{Train,Test}/<digit>/*.bin`` (snnjax's data_dir: ``save_to/NMNIST``)."""
    for split, count in (("Train", per_digit), ("Test", 1)):
        for digit in range(10):
            folder = save_to / "NMNIST" / split / str(digit)
            folder.mkdir(parents=True)
            for k in range(count):
                (folder / f"{k:05d}.bin").write_bytes(nmnist_bytes(*random_events(rng, 60, 34, 34, 300_000)))


def tonic_aedat31(path):
    """``(t, x, y, p)`` as tonic reads an AEDAT 3.1 file (its ``read_dvs_ibm`` decoding; that function itself
    unpacks the header reader's three return values into two in tonic 1.7.0)."""
    version, start, _ = tonic.io.read_aedat_header_from_file(str(path))
    raw = tonic.io.get_aer_events_from_file(str(path), version, start)
    address = raw["address"].astype(np.int64)
    return raw["timeStamp"].astype(np.int64), (address >> 17) & 0x1FFF, (address >> 2) & 0x1FFF, (address >> 1) & 1


def test_tonic_readers_give_snnjax_events(tmp_path):
    rng = np.random.default_rng(0)
    write_nmnist(tmp_path, rng, 1)
    nmnist = get_source("tonic", "train", data_dir=tmp_path, time_steps=2, tonic_dataset="NMNIST")
    ours = get_source("nmnist", "train", data_dir=tmp_path / "NMNIST", time_steps=2)
    assert [str(f) for f in ours.files] == nmnist.dataset.data and nmnist.num_classes == 10
    for i in range(len(ours)):
        events, label = nmnist.dataset[i]
        mine = read_nmnist_bin(ours.files[i])
        assert label == ours.labels[i]
        for name in "txyp":
            np.testing.assert_array_equal(events[name], getattr(mine, name))

    # AEDAT 3.1: two polarity packets (the second past 2^31 us), a special-event packet, invalid events kept by both
    t = np.sort(rng.integers(0, 1 << 31, 40))
    t[20:] += 1 << 31
    x, y, p, valid = rng.integers(0, 128, 40), rng.integers(0, 128, 40), rng.integers(0, 2, 40), rng.random(40) < 0.8
    words = [aedat31_event_word(*map(int, e)) for e in zip(x, y, p, valid, strict=True)]
    body = b"".join(aedat31_packet(1, list(zip(words[h], (t[h] & 0x7FFFFFFF).tolist(), strict=True)), o)
                    for h, o in ((slice(0, 20), 0), (slice(20, 40), 1)))
    path = tmp_path / "user01_lab.aedat"
    path.write_bytes(AEDAT31_HEADER + body + aedat31_packet(2, [(0xFFFFFFFF, 5)], 0))
    mine, theirs = read_aedat31(path), tonic_aedat31(path)
    assert theirs[0].shape == (41,) and mine.t.shape == (40,)  # tonic reads the special event's word as one
    for a, b in zip(theirs[1:], (mine.x, mine.y, mine.p), strict=True):
        np.testing.assert_array_equal(a[:40], b)
    np.testing.assert_array_equal(mine.t, t)
    np.testing.assert_array_equal(theirs[0][:40], t & 0x7FFFFFFF)  # no eventTSOverflow

    # SHD: float16 seconds; tonic's extra/keys (its class names) and extra/speaker as the release has them
    samples = [(np.sort(rng.random(30)).astype(np.float16), rng.integers(0, 700, 30).astype(np.uint16))
               for _ in range(3)]
    (tmp_path / "SHD").mkdir()
    write_shd_h5(tmp_path / "SHD" / "shd_train.h5", samples, [4, 0, 19])
    import h5py  # noqa: PLC0415

    with h5py.File(tmp_path / "SHD" / "shd_train.h5", "a") as f:
        f["extra/keys"] = np.array([f"word{k}".encode() for k in range(20)])
        f["extra/speaker"] = np.zeros(3, np.uint16)
    shd = get_source("tonic", "train", data_dir=tmp_path, time_steps=4, tonic_dataset="SHD")
    ours = get_source("shd", "train", data_dir=tmp_path / "SHD", time_steps=4, cache=False)
    assert shd.num_classes == 20 and shd.example_shape == (4, 700)
    for i in range(3):
        (events, label), (times, units) = shd.dataset[i], ours.spikes(i)
        assert label == ours.labels[i]
        np.testing.assert_array_equal(events["x"], units)
        np.testing.assert_array_equal(events["t"], (times.astype(np.float64) * 1e6).astype(np.int64))  # truncated


def test_tonic_nmnist_trains_through_the_program_and_python(tmp_path, capsys):
    write_nmnist(tmp_path / "data", np.random.default_rng(1), 2)
    c = config_lib.base_config()
    c.model = model_config("mlp", hidden=(8,))
    c.update_from_flattened_dict({
        "data.name": "tonic", "data.data_dir": str(tmp_path / "data"), "data.time_steps": 3,
        "data.options.tonic_dataset": "NMNIST", "data.options.tonic_transforms": "Denoise(filter_time=100000)",
        "data.options.tonic_augment": "DropEvent(p=0.2), RandomFlipPolarity(p=0.5)", "global_batch_size": 4,
        "num_steps": 3, "eval_every_steps": 3, "checkpoint_every_steps": 3, "log_every_steps": 1,
        "parallel.mode": "none"})
    train_and_evaluate(c, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"] == "tonic" and summary["steps"] == 3 and 0.0 <= summary["eval_accuracy"] <= 1.0

    # Python: tonic's N-MNIST class with its own transforms (its check for the archive and 10,000 files off: the
    # class keeps its name, which names its folder); batches [T, N, 34, 34, 2], DropEvent drawn from each key
    nmnist = type("NMNIST", (tonic.datasets.NMNIST,), {"_check_exists": lambda self: True})
    dataset = nmnist(str(tmp_path / "data"), train=True, transform=tonic.transforms.Compose([
        tonic.transforms.DropEvent(p=0.3), tonic.transforms.ToFrame(sensor_size=(34, 34, 2), n_time_bins=3)]))
    source = tonic_source(dataset)
    assert source.example_shape == (3, 34, 34, 2) and source.num_classes == 10 and len(source) == 20
    loader = Loader(source, 4, seed=5, process_index=0, process_count=1)
    first, again = next(loader.batches(2)), next(loader.batches(2))
    assert first["inputs"].shape == (3, 4, 34, 34, 2)
    np.testing.assert_array_equal(first["inputs"], again["inputs"])
    whole = read_nmnist_bin(dataset.data[int(loader.step_indices(0, 2)[0][0])])
    assert 0 < first["inputs"][:, 0].sum() < whole.t.shape[0]  # some of its events dropped
    with pytest.raises(ValueError, match="tonic.transforms has no transform 'Blur'"):
        get_source("tonic", "train", data_dir=tmp_path / "data", tonic_dataset="NMNIST", tonic_augment="Blur(k=1)")
