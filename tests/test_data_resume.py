"""Resuming mid-epoch reads the batches an uninterrupted run reads, for every file-format dataset."""
import numpy as np
import pytest

from snnjax.bench import data as bench
from snnjax.data import Loader
from snnjax.data.registry import get_source

OPTIONS = {
    "dvs128_gesture": {"time_steps": 3, "size": 16, "flip": True, "translate": 2, "num_workers": 2,
                       "temporal_delete": 2},
    "ncaltech101": {"time_steps": 2, "size": 16, "flip": True, "translate": 2, "train_ratio": 1.0,
                    "crop_scale": 0.7, "roll": 2, "rotate": 30.0, "cutout": 4, "nda": True},
    "shd": {"time_steps": 3, "split_by": "time", "temporal_delete": 2, "num_workers": 2},
    "ssc": {"time_steps": 3},
    "image_folder": {"size": 16, "num_workers": 2},
}


@pytest.mark.parametrize("dataset", sorted(OPTIONS))
def test_resume_mid_epoch_matches(dataset, tmp_path, monkeypatch):
    for name, value in (("EVENTS_PER_GESTURE", 300), ("EVENTS_PER_NCALTECH", 300), ("SPIKES_PER_SAMPLE", 100),
                        ("IMAGE_SIZE", (24, 30))):
        monkeypatch.setattr(bench, name, value)
    bench.generate(dataset, tmp_path, 12)
    source = get_source(dataset, "train", data_dir=tmp_path, **OPTIONS[dataset])
    loader = Loader(source, 4, seed=7, process_index=1, process_count=2, prefetch=2)
    steps = loader.steps_per_epoch
    full = [b for _, b in zip(range(2 * steps), loader.batches(), strict=False)]
    start = steps + 1  # mid-way through the second epoch
    resumed = [b for _, b in zip(range(steps - 1), loader.batches(start_step=start), strict=False)]
    assert len(resumed) == steps - 1
    for a, b in zip(full[start:], resumed, strict=True):
        for key in ("inputs", "labels", "mask"):
            np.testing.assert_array_equal(a[key], b[key])
    assert any(np.asarray(b["inputs"]).any() for b in full)
    steps_seen = OPTIONS[dataset].get("temporal_delete", OPTIONS[dataset].get("time_steps"))
    assert source.time_steps == steps_seen and all(b["inputs"].shape[0] == steps_seen for b in full if steps_seen)
