"""The training program trains on a generated folder of each file-format dataset, with its recipe's data settings.

Files are written in the release formats by ``snnjax.bench.data.generate`` (small sizes); the model is a small
spiking MLP (quick to compile; every config's own model trains on synthetic frames in ``test_train.py``).
DVS128 Gesture also drops frames at random (``data.options.temporal_delete``): training steps see 2 of
the 3 frames built, evaluation all 3.
"""
import json
import pathlib

import pytest

from snnjax.bench import data as bench
from snnjax.models.registry import model_config
from snnjax.train import config as config_lib
from snnjax.train import train_and_evaluate

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECIPES = {  # dataset -> (config, overrides)
    "shd": ("shd_mlp", {"data.time_steps": 4, "data.options.num_workers": 2}),
    "ssc": ("ssc_mlp", {"data.time_steps": 4}),
    "dvs128_gesture": ("dvsgesture_plif", {"data.time_steps": 3, "data.options.size": 16,
                                           "data.options.temporal_delete": 2, "data.options.flip": True}),
    "ncaltech101": ("ncaltech101_vgg", {"data.time_steps": 2, "data.options.size": 16,
                                        "data.options.train_ratio": 0.75}),
    "image_folder": ("imagenet_folder_spikformer", {"data.time_steps": 2, "data.options.size": 16,
                                                    "data.options.num_workers": 2}),
}


def recipe(name: str):
    return config_lib.load(ROOT / "configs" / f"{name}.py")


@pytest.mark.parametrize("dataset", sorted(RECIPES))
def test_trains_on_a_generated_folder(dataset, tmp_path, monkeypatch, capsys):
    for name, value in (("EVENTS_PER_GESTURE", 400), ("EVENTS_PER_NCALTECH", 400), ("SPIKES_PER_SAMPLE", 200),
                        ("IMAGE_SIZE", (24, 30))):
        monkeypatch.setattr(bench, name, value)
    bench.generate(dataset, tmp_path / "data", 16)
    config, overrides = RECIPES[dataset]
    c = recipe(config)
    c.model = model_config("mlp", hidden=(8,))
    c.update_from_flattened_dict({**overrides, "data.data_dir": str(tmp_path / "data"), "global_batch_size": 8,
                                  "num_steps": 2, "eval_every_steps": 2, "checkpoint_every_steps": 2,
                                  "log_every_steps": 1, "parallel.mode": "none"})
    train_and_evaluate(c, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"] == dataset and summary["steps"] == 2
    assert 0.0 <= summary["eval_accuracy"] <= 1.0
    if dataset == "dvs128_gesture":
        assert "training steps see 2 of them (a sorted random subset per example), evaluation all 3" in \
            capsys.readouterr().out
