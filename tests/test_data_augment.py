"""Frame augmentations: the random temporal delete and the CIFAR10-DVS recipe's crop / roll / rotate / cutout / NDA.

Each is checked against an independent construction (frame k holding the value k, NumPy's rot90 and roll,
nearest upsampling as np.repeat), and through the sources and the config that plumb it.
"""
import numpy as np
import pytest

from snnjax.bench import data as bench
from snnjax.data import Loader
from snnjax.data.augment import EventAugment, resized_crop_frames, rotate_frames
from snnjax.data.registry import get_source
from snnjax.train import base_config, validate
from snnjax.train.config import source_kwargs


def labelled_frames(t=10, h=6, w=5, c=2):
    """Frames whose frame k holds k + 1 everywhere (so a kept frame names itself)."""
    return np.broadcast_to(np.arange(1, t + 1, dtype=np.float32)[:, None, None, None], (t, h, w, c)).copy()


def test_temporal_delete_keeps_a_sorted_distinct_subset_per_key():
    frames = labelled_frames()
    aug = EventAugment(temporal_delete=4)
    subsets = set()
    for position in range(20):
        out = aug(frames, np.random.default_rng([3, 1, position]))
        assert out.shape == (4, 6, 5, 2)
        kept = out[:, 0, 0, 0].astype(int) - 1
        assert np.all(np.diff(kept) > 0) and kept.min() >= 0 and kept.max() < 10
        np.testing.assert_array_equal(out, frames[kept])
        np.testing.assert_array_equal(out, aug(frames, np.random.default_rng([3, 1, position])))
        subsets.add(tuple(kept))
    assert len(subsets) > 10  # 210 possible subsets of 4 of 10
    spikes = np.arange(10 * 7, dtype=np.float32).reshape(10, 7)  # SHD-like [T, channels]
    kept = EventAugment(temporal_delete=10)(spikes, np.random.default_rng(0))
    np.testing.assert_array_equal(kept, spikes)  # keeping all T frames keeps them in order
    with pytest.raises(ValueError, match=r"temporal_delete=11 keeps more frames than the T=10.*time_steps"):
        EventAugment(temporal_delete=11).time_steps(10)


def test_rotate_crop_roll_and_cutout_against_numpy():
    rng = np.random.default_rng(0)
    frames = rng.random((3, 6, 6, 2)).astype(np.float32)
    np.testing.assert_array_equal(rotate_frames(frames, 90.0), np.rot90(frames, 1, axes=(1, 2)))
    np.testing.assert_array_equal(rotate_frames(frames, 0.0), frames)
    # The top-left quarter resized back doubles every row and column (nearest).
    np.testing.assert_array_equal(resized_crop_frames(frames, 0, 0, 3, 3), frames[:, :3, :3].repeat(2, 1).repeat(2, 2))
    np.testing.assert_array_equal(resized_crop_frames(frames, 0, 0, 6, 6), frames)
    frames = frames + 1  # no zero pixels: a cutout shows itself
    rolls = {(dy, dx): np.roll(frames, (dy, dx), axis=(1, 2)) for dy in range(-2, 3) for dx in range(-2, 3)}
    cutouts = []
    for position in range(12):
        key = np.random.default_rng([0, 0, position])
        out = EventAugment(roll=2)(frames, key)
        assert any(np.array_equal(out, r) for r in rolls.values())
        out = EventAugment(cutout=4)(frames, np.random.default_rng([0, 0, position]))
        hole = out == 0
        assert (out[~hole] == frames[~hole]).all() and (hole == hole[:1, :, :, :1]).all()
        rows, cols = np.nonzero(hole[0, :, :, 0])  # one rectangle, at most 4 x 4, the same in every frame
        height, width = np.ptp(rows) + 1, np.ptp(cols) + 1
        assert height <= 4 and width <= 4 and rows.size == height * width
        cutouts.append(rows.size)
        # NDA: exactly one of the two, picked per example.
        out = EventAugment(roll=2, cutout=4, nda=True)(frames, np.random.default_rng([0, 0, position]))
        is_roll = any(np.array_equal(out, r) for r in rolls.values())
        is_cutout = (out[out != 0] == frames[out != 0]).all() and (out == 0).any()
        assert is_roll != is_cutout or np.array_equal(out, frames)
    assert len(set(cutouts)) > 1  # holes near the border are clipped
    with pytest.raises(ValueError, match="nda=True picks one of roll / rotate / cutout"):
        EventAugment(nda=True)
    with pytest.raises(ValueError, match=r"crop_scale must be in \(0, 1\].*data.options.crop_scale"):
        EventAugment(crop_scale=0.0)


def test_sources_take_the_augmentations_and_refuse_keyless_deletes(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "SPIKES_PER_SAMPLE", 60)
    bench.generate("shd", tmp_path, 8)
    train = get_source("shd", "train", data_dir=tmp_path, time_steps=6, temporal_delete=4, num_workers=2)
    test = get_source("shd", "test", data_dir=tmp_path, time_steps=6, temporal_delete=4)
    assert train.example_shape == (4, 700) and test.example_shape == (6, 700)
    full = get_source("shd", "train", data_dir=tmp_path, time_steps=6)
    loader = Loader(train, 4, seed=1, process_index=0, process_count=1, prefetch=0)
    batch = next(loader.epoch_batches(0))
    assert batch["inputs"].shape == (4, 4, 700)
    indices, _ = loader.step_indices(0, 0)
    whole = full.read(indices)[0]
    for row in range(4):  # each example's 4 frames are 4 of its 6 (distinct: 10 random spikes each), in order
        kept = [[k for k in range(6) if np.array_equal(frame, whole[row, k])] for frame in batch["inputs"][:, row]]
        assert all(len(k) == 1 for k in kept) and np.all(np.diff([k[0] for k in kept]) > 0), kept
    with pytest.raises(ValueError, match="read it through snnjax.data.Loader"):
        train.read([0])
    with pytest.raises(ValueError, match="temporal_delete=7 keeps more frames than the T=6"):
        get_source("shd", "test", data_dir=tmp_path, time_steps=6, temporal_delete=7)
    c = base_config()
    c.data.name, c.data.data_dir, c.data.time_steps = "shd", str(tmp_path), 6
    c.data.options.temporal_delete = 4
    validate(c)
    assert source_kwargs(c)[1] == ["data.options.temporal_delete=4: examples are built with data.time_steps=6 frames; "
                                   "training steps see 4 of them (a sorted random subset per example), evaluation "
                                   "all 6"]
    c.data.options.temporal_delete = 7
    with pytest.raises(ValueError, match=r"config.data.options.temporal_delete=7 keeps more frames than the "
                                         r"config.data.time_steps=6.*temporal_delete= / time_steps="):
        validate(c)
    c.data.options.temporal_delete, c.parallel.mesh = 3, "time=2,data=-1"
    with pytest.raises(ValueError, match="temporal_delete=3: the training steps' 3 time steps do not divide over"):
        validate(c)
