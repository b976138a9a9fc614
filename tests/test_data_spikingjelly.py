"""The same files decoded and integrated by SpikingJelly 2.0.0's readers give identical events and frames.

Runs SpikingJelly in ``$SNNJAX_SJ_PYTHON`` (torch is never imported here); skipped without it.
Its ``datasets`` package imports torchvision / torchaudio, which the script replaces by stand-in
modules (only the reader and integration functions are used).
"""
import os
import subprocess
import textwrap

import numpy as np
import pytest

from snnjax.bench import data_formats as fmt
from snnjax.data.dvs128_gesture import read_aedat31
from snnjax.data.frames import FrameSpec
from snnjax.data.ncaltech101 import read_ncaltech101_bin
from snnjax.data.registry import get_source

SJ_PYTHON = os.environ.get("SNNJAX_SJ_PYTHON")
pytestmark = pytest.mark.skipif(not SJ_PYTHON, reason="SpikingJelly's interpreter not given (SNNJAX_SJ_PYTHON)")

SCRIPT = textwrap.dedent("""
    import sys, types
    from pathlib import Path
    import numpy as np
    def stand_in(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {}) if attr[:1].isupper() else (lambda *x, **k: None)
    for name in ("torchvision", "torchvision.datasets", "torchvision.datasets.utils", "torchvision.transforms",
                 "torchaudio", "torchaudio.transforms"):
        module = types.ModuleType(name)
        module.__path__ = []
        module.__getattr__ = stand_in
        sys.modules[name] = module
    import h5py
    from spikingjelly.datasets import utils, shd, dvs128_gesture

    root, out = Path(sys.argv[1]), {}
    def frames_all(key, events, H, W, T, duration):
        for split_by in ("number", "time"):
            f = utils.integrate_events_by_fixed_frames_number(events, split_by, T, H, W)
            out[f"{key}/{split_by}"] = f.transpose(0, 2, 3, 1)
        out[f"{key}/duration"] = utils.integrate_events_by_fixed_duration(events, duration, H, W).transpose(0, 2, 3, 1)

    split = root / "sj_split"
    for label in range(11):
        (split / str(label)).mkdir(parents=True)
    for rec in ("user01_fluorescent", "user24_lab"):
        ev = utils.load_aedat_v3(root / "DvsGesture" / f"{rec}.aedat")
        for k in "txyp":
            out[f"aedat/{rec}/{k}"] = ev[k].astype(np.int64)
        dvs128_gesture._split_aedat_files_to_np(rec, root / "DvsGesture" / f"{rec}.aedat",
                                                root / "DvsGesture" / f"{rec}_labels.csv", split)
    for f in sorted(split.rglob("*.npz")):
        ev = dict(np.load(f))
        frames_all(f"gesture/{f.parent.name}/{f.stem}", ev, 128, 128, 4, 300)
    for f in sorted((root / "Caltech101").rglob("*.bin")):
        ev = utils.load_ATIS_bin(f)
        out[f"atis/{f.parent.name}/{f.stem}/t"] = ev["t"].astype(np.int64)
        frames_all(f"atis/{f.parent.name}/{f.stem}", ev, 180, 240, 4, 50000)
    with h5py.File(root / "shd_train.h5") as h5:
        for i in range(len(h5["labels"])):
            ev = {"t": h5["spikes"]["times"][i], "x": h5["spikes"]["units"][i]}
            for split_by in ("number", "time"):
                out[f"shd/{i}/{split_by}"] = shd._integrate_events_by_fixed_frames_number(ev, split_by, 5, 700)
            out[f"shd/{i}/duration"] = shd._integrate_events_by_fixed_duration(ev, 60, 700)
    np.savez(root / "sj.npz", **out)
""")


def expected_duration(sj_frames, steps):
    """SpikingJelly's variable-length frames cut or zero-padded to ``steps``."""
    out = np.zeros((steps, *sj_frames.shape[1:]))
    keep = min(steps, sj_frames.shape[0])
    out[:keep] = sj_frames[:keep]
    return out


def test_readers_and_frames_match_spikingjelly(tmp_path):
    rng = np.random.default_rng(0)
    gesture = tmp_path / "DvsGesture"
    gesture.mkdir()
    fmt.write_gesture_recording(gesture, "user01_fluorescent", [(1, 1000, 9000), (11, 9500, 20000), (11, 21000, 30000),
                                                                (4, 30500, 41000)], 3000, rng)
    base = 1 << 31
    fmt.write_gesture_recording(gesture, "user24_lab", [(2, base - 5000, base + 5000), (9, base + 6000, base + 9000)],
                                2000, rng)
    (gesture / "trials_to_train.txt").write_text("user01_fluorescent.aedat\n")
    (gesture / "trials_to_test.txt").write_text("user24_lab.aedat\n")
    for cls in ("BACKGROUND_Google", "anchor"):
        (tmp_path / "Caltech101" / cls).mkdir(parents=True)
        for k in range(2):
            n = 4000
            t = np.sort(rng.integers(0, 300_000, n))
            (tmp_path / "Caltech101" / cls / f"image_{k + 1:04d}.bin").write_bytes(
                fmt.atis_bytes(t, rng.integers(0, 240, n), rng.integers(0, 180, n), rng.integers(0, 2, n)))
    spikes = [fmt.random_spikes(rng, int(rng.integers(300, 3000)), 0.8) for _ in range(6)]
    fmt.write_heidelberg_h5(tmp_path / "shd_train.h5", [s[0] for s in spikes], [s[1] for s in spikes],
                            np.arange(6) * 3)
    run = subprocess.run([SJ_PYTHON, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    sj = dict(np.load(tmp_path / "sj.npz"))

    for rec in ("user01_fluorescent", "user24_lab"):
        ours = read_aedat31(gesture / f"{rec}.aedat")
        for k in "txyp":
            np.testing.assert_array_equal(getattr(ours, k), sj[f"aedat/{rec}/{k}"])
    modes = {"number": {}, "time": {"split_by": "time"}, "duration": {"split_by": "duration", "duration": 300}}
    for split in ("train", "test"):
        for mode, options in modes.items():
            src = get_source("dvs128_gesture", split, data_dir=tmp_path, time_steps=4, cache=False, **options)
            frames, labels = src.read(np.arange(len(src)))
            for i in range(len(src)):
                key = f"gesture/{labels[i]}/{src.samples[i][4]}/{mode}"  # SpikingJelly's folder: class - 1
                want = sj[key]
                np.testing.assert_array_equal(frames[i], expected_duration(want, 4) if mode == "duration" else want)
    assert sum(k.startswith("gesture/") for k in sj) == 3 * 6

    for mode, options in modes.items():
        options = {**options, "duration": 50000} if mode == "duration" else options
        src = get_source("ncaltech101", "all", data_dir=tmp_path, time_steps=4, cache=False, **options)
        frames, _ = src.read(np.arange(len(src)))
        for i, f in enumerate(src.files):
            key = f"atis/{f.parent.name}/{f.stem}"
            np.testing.assert_array_equal(read_ncaltech101_bin(f).t, sj[f"{key}/t"])
            want = sj[f"{key}/{mode}"]
            np.testing.assert_array_equal(frames[i], expected_duration(want, 4) if mode == "duration" else want)

    shd_modes = {"number": FrameSpec(5), "time": FrameSpec(5, "time"), "duration": FrameSpec(40, "duration", 60)}
    shd = get_source("shd", "train", data_dir=tmp_path)
    for mode, spec in shd_modes.items():
        frames, labels = shd.with_frames(spec).read(np.arange(6))
        np.testing.assert_array_equal(labels, np.arange(6) * 3)
        for i in range(6):
            want = sj[f"shd/{i}/{mode}"]
            np.testing.assert_array_equal(frames[i], expected_duration(want, 40) if mode == "duration" else want)
