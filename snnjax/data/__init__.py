"""Datasets, per-process deterministic batching, and input encoders.

Sources return numpy arrays per example index; :class:`Loader` turns them
into this process's time-major batches; :mod:`snnjax.data.encoders` turns
static images into spike trains inside the jitted step.
"""
from snnjax.data.cifar10dvs import CIFAR10DVS_CLASS_NAMES, cifar10dvs_source, read_cifar10dvs_aedat
from snnjax.data.digits import digits_source
from snnjax.data.dvs128_gesture import dvs128_gesture_source, read_aedat31
from snnjax.data.encoders import ENCODERS, direct_encode, encode, poisson_encode
from snnjax.data.event_folder import EventFolderSource
from snnjax.data.events import Events, integrate_by_number, resize_area, segment_bounds_by_number
from snnjax.data.frames import FrameSpec
from snnjax.data.image_folder import image_folder_source
from snnjax.data.loader import Batch, Loader
from snnjax.data.ncaltech101 import ncaltech101_source
from snnjax.data.nmnist import nmnist_source, read_nmnist_bin
from snnjax.data.registry import SOURCE_NAMES, get_source
from snnjax.data.shd import shd_source, ssc_source
from snnjax.data.source import ArraySource, Source
from snnjax.data.synthetic import SyntheticDVSSource
from snnjax.data.tfds_images import TfdsImageSource
from snnjax.data.tonic_source import TonicSource, tonic_source

__all__ = [
    "ArraySource", "Batch", "CIFAR10DVS_CLASS_NAMES", "ENCODERS", "EventFolderSource", "Events",
    "FrameSpec", "Loader", "SOURCE_NAMES", "Source", "SyntheticDVSSource", "TfdsImageSource", "TonicSource",
    "cifar10dvs_source", "digits_source", "direct_encode", "dvs128_gesture_source", "encode", "get_source",
    "image_folder_source", "integrate_by_number", "ncaltech101_source", "nmnist_source", "poisson_encode",
    "read_aedat31", "read_cifar10dvs_aedat", "read_nmnist_bin", "resize_area", "segment_bounds_by_number",
    "shd_source", "ssc_source", "tonic_source",
]
