"""Static image datasets read through ``tfds.data_source`` (random access, no TF graph).

The data must already be prepared in ``data_dir`` in the ``array_record`` file
format (``tfds.data_source`` cannot random-access ``tfrecord``)::

    tfds build mnist --data_dir=DATA_DIR --file_format=array_record
    # or, in Python:
    tfds.builder("mnist", data_dir=DATA_DIR).download_and_prepare(file_format="array_record")

Decoding the stored PNGs without TensorFlow needs Pillow or OpenCV installed.
Images come back as float32 ``[n, H, W, C]`` = uint8 / 255.
"""
from __future__ import annotations

import os

import numpy as np

from snnjax.data.source import Source

TFDS_IMAGE_DATASETS = ("mnist", "fashion_mnist", "cifar10")


def _prepare_hint(name: str, data_dir: str | None) -> str:
    where = data_dir if data_dir is not None else "~/tensorflow_datasets (TFDS_DATA_DIR)"
    return (f"Prepare it with `tfds build {name} --data_dir={where} --file_format=array_record` "
            f"or `tfds.builder({name!r}, data_dir=...).download_and_prepare(file_format='array_record')`.")


def open_tfds_data_source(name: str, split: str, data_dir: str | os.PathLike | None):
    """``tfds.data_source(name, split=split, data_dir=data_dir, download=False)`` with clear errors.

    Raises:
      FileNotFoundError: the dataset is not prepared in ``data_dir``.
    """
    import tensorflow_datasets as tfds  # noqa: PLC0415 (loads TensorFlow: only for the TFDS sources)

    data_dir = None if data_dir is None else os.fspath(data_dir)
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as err:  # tfds raises several unrelated exception types when the data is absent
        builder = tfds.builder(name, data_dir=data_dir)
        if not builder.is_prepared():
            raise FileNotFoundError(
                f"TFDS dataset {name!r} is not prepared in data_dir={data_dir!r} "
                f"(looked in {builder.data_dir}). {_prepare_hint(name, data_dir)}") from err
        raise RuntimeError(
            f"Could not open TFDS dataset {name!r} split {split!r} from {builder.data_dir} for "
            f"random access. It must be prepared with file_format='array_record'. "
            f"{_prepare_hint(name, data_dir)}") from err


class TfdsImageSource(Source):
    """A TFDS image-classification dataset (features ``image`` uint8, ``label``).

    Args:
      name: TFDS name, e.g. ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"``.
      split: TFDS split string (``"train"``, ``"test"``, ``"train[:90%]"``, ...).
      data_dir: TFDS data folder (``None``: TFDS's default).
    """

    def __init__(self, name: str, split: str, data_dir: str | os.PathLike | None = None):
        self.name = name
        self._ds = open_tfds_data_source(name, split, data_dir)
        features = self._ds.dataset_info.features
        self.num_classes = int(features["label"].num_classes)
        self.example_shape = tuple(int(d) for d in features["image"].shape)

    def __len__(self) -> int:
        return len(self._ds)

    def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        examples = [self._ds[int(i)] for i in indices]
        images = np.stack([np.asarray(ex["image"]) for ex in examples])
        if images.dtype != np.uint8:
            raise ValueError(f"{self.name}: expected uint8 images, got {images.dtype}")
        images = images.astype(np.float32) / np.float32(255.0)
        labels = np.asarray([ex["label"] for ex in examples], np.int32)
        return images, labels
