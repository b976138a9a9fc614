"""scikit-learn's bundled 8x8 digits (no download): the default dataset.

1797 grayscale images with 16 intensity levels (values 0..16), scaled to
float32 in ``[0, 1]`` as ``[n, 8, 8, 1]``; 10 classes. ``split='train'`` and
``split='test'`` are a deterministic, stratified, disjoint 80/20 split: for
each class ``c`` its examples (in sklearn's order) are permuted by
``np.random.default_rng([seed, c])`` and the first ``round(test_fraction * n_c)``
of them form the test split.
"""
from __future__ import annotations

import numpy as np

from snnjax.data.source import ArraySource

SPLITS = ("train", "test", "all")


def digits_split_indices(labels: np.ndarray, split: str, *, test_fraction: float = 0.2,
                         seed: int = 0) -> np.ndarray:
    """Sorted indices ``[m]`` of ``split`` in a per-class (stratified) split of ``labels``."""
    if split not in SPLITS:
        raise ValueError(f"digits split must be one of {SPLITS}, got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if split == "all":
        return np.arange(labels.shape[0])
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        members = np.random.default_rng([seed, int(c)]).permutation(members)
        n_test = int(round(test_fraction * members.size))
        chosen.append(members[:n_test] if split == "test" else members[n_test:])
    return np.sort(np.concatenate(chosen))


def digits_source(split: str = "train", *, test_fraction: float = 0.2, seed: int = 0) -> ArraySource:
    """The sklearn digits as a source of images ``[n, 8, 8, 1]`` in [0, 1] and labels ``[n]``."""
    from sklearn.datasets import load_digits  # noqa: PLC0415 (scikit-learn loads in seconds; only this source needs it)

    data = load_digits()
    images = (data.images.astype(np.float32) / 16.0)[..., None]
    labels = data.target.astype(np.int32)
    keep = digits_split_indices(labels, split, test_fraction=test_fraction, seed=seed)
    return ArraySource(images[keep], labels[keep], num_classes=10)
