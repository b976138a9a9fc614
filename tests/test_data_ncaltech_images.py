"""N-Caltech101 (ATIS .bin class folders) and image folders (JPEG/PNG class folders)."""
import numpy as np
import pytest
from PIL import Image

from snnjax.data import Loader
from snnjax.data.frames import FrameSpec
from snnjax.data.registry import get_source


def atis_record(t, x, y, p):
    return bytes([x, y, (p << 7) | (t >> 16), (t >> 8) & 0xFF, t & 0xFF])


def write_ncaltech(tmp_path, rng, counts):
    root = tmp_path / "Caltech101"
    written = {}
    for name, n_files in counts.items():
        (root / name).mkdir(parents=True)
        for k in range(n_files):
            n = 30
            t = np.sort(rng.integers(0, 1 << 23, n)).tolist()
            ev = [(t[i], int(rng.integers(0, 240)), int(rng.integers(0, 180)), int(rng.integers(0, 2)))
                  for i in range(n)]
            (root / name / f"image_{k + 1:04d}.bin").write_bytes(b"".join(atis_record(*e) for e in ev))
            written[(name, k)] = ev
    return root, written


def test_ncaltech101_classes_split_and_frames(tmp_path):
    rng = np.random.default_rng(0)
    counts = {"accordion": 3, "BACKGROUND_Google": 2, "Faces_easy": 4, "ant": 1}
    _, written = write_ncaltech(tmp_path, rng, counts)
    train = get_source("ncaltech101", "train", data_dir=tmp_path, time_steps=2, train_ratio=0.5, cache=False)
    test = get_source("ncaltech101", "test", data_dir=tmp_path, time_steps=2, train_ratio=0.5, cache=False)
    classes = ["BACKGROUND_Google", "Faces_easy", "accordion", "ant"]  # sorted, upper case first
    assert train.num_classes == 4 and train.example_shape == (2, 180, 240, 2)
    cut = {c: -(-counts[c] // 2) for c in classes}  # ceil(0.5 n)
    assert len(train) == sum(cut.values()) and len(test) == sum(counts.values()) - len(train)
    frames, labels = train.read(np.arange(len(train)))
    expected = [(i, c, k) for i, c in enumerate(classes) for k in range(cut[c])]
    np.testing.assert_array_equal(labels, [e[0] for e in expected])
    for row, (_, c, k) in enumerate(expected):
        want = np.zeros((2, 180, 240, 2))
        for j, (_, x, y, p) in enumerate(written[(c, k)]):
            want[min(j // 15, 1), y, x, p] += 1
        np.testing.assert_array_equal(frames[row], want)
    no_bg = get_source("ncaltech101", "train", data_dir=tmp_path / "Caltech101", background=False, cache=False)
    assert no_bg.num_classes == 3


def test_ncaltech101_errors_and_custom_integrator_cache(tmp_path):
    with pytest.raises(FileNotFoundError, match="Caltech101.zip"):
        get_source("ncaltech101", "train", data_dir=tmp_path)
    rng = np.random.default_rng(1)
    root, _ = write_ncaltech(tmp_path, rng, {"a": 2, "b": 2})
    (root / "b" / "image_0002.bin").write_bytes(b"\xff" * 7)
    src = get_source("ncaltech101", "all", data_dir=tmp_path, cache=False)
    with pytest.raises(ValueError, match="image_0002.bin"):
        src.read([3])

    def first_event(events, steps, height, width):
        frames = np.zeros((steps, height, width, 2))
        frames[0, events.y[0], events.x[0], 1] = 1
        return frames

    custom = get_source("ncaltech101", "train", data_dir=tmp_path, size=24).with_frames(
        FrameSpec(3, integrator=first_event))
    frames, _ = custom.read([0])
    assert frames.shape == (1, 3, 24, 24, 2) and frames.sum() > 0
    assert custom.cache_path(0).is_relative_to(root / "custom_first_event_T3_area24x24")


def write_images(tmp_path, rng):
    for split, per in (("train", 3), ("val", 2)):
        for c in ("n01", "n02"):
            (tmp_path / split / c).mkdir(parents=True)
            for k in range(per):
                pixels = rng.integers(0, 256, (256, 300, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / c / f"img_{k}.png")
    Image.fromarray(rng.integers(0, 256, (300, 200, 3), dtype=np.uint8)).save(tmp_path / "train" / "n02" / "x.JPEG")


def test_image_folder_eval_crop_is_exact_and_train_is_keyed(tmp_path):
    rng = np.random.default_rng(2)
    write_images(tmp_path, rng)
    val = get_source("image_folder", "test", data_dir=tmp_path, size=224, num_workers=2)
    assert len(val) == 4 and val.num_classes == 2 and val.example_shape == (224, 224, 3)
    images, labels = val.read(np.arange(4), keys=np.zeros((4, 3), np.int64))  # eval ignores keys
    np.testing.assert_array_equal(labels, [0, 0, 1, 1])
    original = np.asarray(Image.open(tmp_path / "val" / "n01" / "img_0.png"), np.float32) / 255
    # shorter side 256 = round(224 / 0.875): no resize; centre crop rows 16..240, columns 38..262
    np.testing.assert_allclose(images[0], original[16:240, 38:262], atol=1e-6)
    train = get_source("image_folder", "train", data_dir=tmp_path, size=32)
    assert len(train) == 7  # the JPEG too
    keys = np.array([[0, 0, 0], [0, 0, 1], [0, 0, 0]])
    a, _ = train.read([6, 6, 6], keys)
    np.testing.assert_array_equal(a[0], a[2])
    assert not np.array_equal(a[0], a[1]) and a.min() >= 0 and a.max() <= 1
    loader = Loader(train, 2, seed=3, process_index=1, process_count=2, prefetch=2)
    full = [b for _, b in zip(range(8), loader.batches(), strict=False)]
    resumed = [b for _, b in zip(range(3), loader.batches(start_step=5), strict=False)]
    for x, y in zip(full[5:], resumed, strict=True):
        np.testing.assert_array_equal(x["inputs"], y["inputs"])
    assert full[0]["inputs"].shape == (1, 32, 32, 3)


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="train"):
        get_source("image_folder", "train", data_dir=tmp_path)
    (tmp_path / "train" / "a").mkdir(parents=True)
    (tmp_path / "val" / "zz").mkdir(parents=True)
    with pytest.raises(ValueError, match="zz"):
        get_source("image_folder", "test", data_dir=tmp_path)
    (tmp_path / "train" / "a" / "bad.jpg").write_bytes(b"garbage")
    src = get_source("image_folder", "train", data_dir=tmp_path)
    with pytest.raises(ValueError, match="bad.jpg.*cannot decode"):
        src.read([0])
