"""Image sources (digits, TFDS through mock data), the synthetic DVS source, the registry, encoders."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import load_digits

from snnjax.data import encoders
from snnjax.data.digits import digits_split_indices
from snnjax.data.event_folder import EVENT_OPTIONS
from snnjax.data.loader import Loader
from snnjax.data.registry import DATASETS, SOURCE_NAMES, get_source

# ----------------------------------------------------------------------------- digits

def test_digits_split_is_stratified_disjoint_and_scaled():
    labels = load_digits().target
    train = digits_split_indices(labels, "train")
    test = digits_split_indices(labels, "test")
    assert len(train) + len(test) == 1797 and not set(train) & set(test)
    for c in range(10):
        n_c = (labels == c).sum()
        assert (labels[test] == c).sum() == round(0.2 * n_c)
    np.testing.assert_array_equal(digits_split_indices(labels, "test"), test)  # deterministic
    assert not np.array_equal(digits_split_indices(labels, "test", seed=1), test)

    src = get_source("digits", "train")
    assert len(src) == len(train) and src.num_classes == 10 and src.example_shape == (8, 8, 1)
    images, labs = src.read(np.arange(len(src)))
    assert images.dtype == np.float32 and images.min() == 0.0 and images.max() == 1.0
    # 16 gray levels scaled by 1/16.
    np.testing.assert_array_equal(np.unique(images * 16), np.arange(17))
    np.testing.assert_array_equal(labs, labels[train])
    assert len(get_source("digits", "test")) == len(test)
    with pytest.raises(ValueError, match="split"):
        get_source("digits", "validation")


# ----------------------------------------------------------------------------- TFDS

@pytest.mark.parametrize("name,shape", [("mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))])
def test_tfds_source_with_mock_data(tmp_path, name, shape):
    import tensorflow_datasets as tfds  # noqa: PLC0415 (slow to import; only these tests use it)

    with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
        src = get_source(name, "train", data_dir=tmp_path)
        raw = tfds.data_source(name, split="train", data_dir=tmp_path)
        assert len(src) == 12 and src.num_classes == 10 and src.example_shape == shape
        images, labels = src.read([3, 0, 3])
        assert images.shape == (3, *shape) and images.dtype == np.float32
        np.testing.assert_array_equal(images[1], raw[0]["image"].astype(np.float32) / 255)
        np.testing.assert_array_equal(images[0], images[2])
        assert labels.dtype == np.int32 and labels[1] == raw[0]["label"]
        batch = next(iter(Loader(src, 4, seed=0, process_index=1, process_count=2).epoch_batches(0)))
        assert batch["inputs"].shape == (2, *shape)
        assert 0.0 <= batch["inputs"].min() and batch["inputs"].max() <= 1.0


def test_tfds_missing_data_names_dataset_and_dir(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        get_source("fashion_mnist", "train", data_dir=tmp_path / "tfds")
    message = str(info.value)
    assert "fashion_mnist" in message and str(tmp_path / "tfds") in message
    assert "tfds build" in message and "download_and_prepare" in message


# ----------------------------------------------------------------------------- synthetic DVS

def test_synthetic_dvs_shapes_determinism_and_labels():
    src = get_source("synthetic_dvs", "train", num_examples=40, time_steps=6)
    assert len(src) == 40 and src.example_shape == (6, 48, 48, 2) and src.time_steps == 6
    frames, labels = src.read([7, 3, 7])
    assert frames.shape == (3, 6, 48, 48, 2) and frames.dtype == np.float32
    np.testing.assert_array_equal(frames[0], frames[2])
    np.testing.assert_array_equal(frames[0], src.read([7])[0][0])
    np.testing.assert_array_equal(labels, [7, 3, 7])
    assert frames.min() >= 0 and np.all(frames == np.round(frames))
    other = get_source("synthetic_dvs", "test", num_examples=40, time_steps=6)
    assert not np.array_equal(other.read([7])[0], frames[:1])
    assert len(get_source("synthetic_dvs", "train")) == 9000


def test_synthetic_dvs_is_learnable():
    """Nearest class centroid (of time-summed frames) beats chance by far."""
    train = get_source("synthetic_dvs", "train", num_examples=200, time_steps=4, size=24)
    test = get_source("synthetic_dvs", "test", num_examples=100, time_steps=4, size=24)
    x, y = train.read(np.arange(200))
    xt, yt = test.read(np.arange(100))
    feats, feats_t = x.reshape(200, -1), xt.reshape(100, -1)
    centroids = np.stack([feats[y == c].mean(0) for c in range(10)])
    pred = np.argmin(((feats_t[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (pred == yt).mean() > 0.8


# ----------------------------------------------------------------------------- registry

def test_registry_errors():
    with pytest.raises(ValueError) as info:
        get_source("imagenet", "train")
    for name in SOURCE_NAMES:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="data_dir"):
        get_source("digits", "train", data_dir="/somewhere")
    with pytest.raises(ValueError, match=r"no option\(s\) \['no_such_option'\]; its options: \['noise_rate'"):
        get_source("synthetic_dvs", "train", no_such_option=1)


@pytest.mark.parametrize("name", SOURCE_NAMES)
def test_registry_entry_matches_its_factory(name):
    """What an entry declares (data_dir, time_steps, option types) is what its factory takes: its own keywords,
    and for the event-file datasets (``**options``) the shared ``EVENT_OPTIONS``."""
    entry = DATASETS[name]
    params = inspect.signature(entry.make).parameters
    assert ("data_dir" in params) == entry.reads_files
    assert ("time_steps" in params) == entry.events
    own = {k for k, p in params.items() if p.kind is not p.VAR_KEYWORD} - {"self", "split", "data_dir", "time_steps"}
    shared = set(EVENT_OPTIONS) if any(p.kind is p.VAR_KEYWORD for p in params.values()) else set()
    assert own | shared == set(entry.options) and not own & shared
    for key in own:
        default = params[key].default
        assert default is None or isinstance(default, entry.options[key]), (key, default, entry.options[key])


# ----------------------------------------------------------------------------- encoders

def test_direct_encoding_repeats_images():
    images = jnp.arange(24.0).reshape(2, 2, 3, 2) / 24
    out = encoders.encode("direct", images, 5)
    assert out.shape == (5, 2, 2, 3, 2)
    np.testing.assert_array_equal(out, np.broadcast_to(images, (5, *images.shape)))


def test_poisson_encoding_rates():
    p = jnp.array([0.0, 0.1, 0.5, 0.9, 1.0, 1.3, -0.2], jnp.float32).reshape(1, 7, 1, 1)
    images = jnp.tile(p, (4, 1, 1, 1))  # [N=4, 7, 1, 1]
    encode = jax.jit(encoders.poisson_encode, static_argnums=2)
    spikes = encode(jax.random.key(0), images, 4000)
    assert spikes.shape == (4000, 4, 7, 1, 1) and spikes.dtype == jnp.float32
    assert set(np.unique(np.asarray(spikes)).tolist()) <= {0.0, 1.0}
    rates = np.asarray(spikes).mean(axis=(0, 1)).ravel()  # 16000 Bernoulli draws per pixel
    want = np.clip(np.asarray(p).ravel(), 0, 1)
    tolerance = 4 * np.sqrt(want * (1 - want) / 16000) + 1e-9
    assert np.all(np.abs(rates - want) <= tolerance), (rates, want)
    same = encode(jax.random.key(0), images, 4000)
    np.testing.assert_array_equal(same, spikes)
    other = encode(jax.random.key(1), images, 4000)
    assert not np.array_equal(other, spikes)
    with pytest.raises(ValueError, match="key"):
        encoders.encode("poisson", images, 3)
    with pytest.raises(ValueError, match="direct"):
        encoders.encode("latency", images, 3)
