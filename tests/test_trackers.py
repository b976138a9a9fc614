"""``config.log_to``: Weights & Biases (offline) and MLflow (a local store) get the scalars metrics.jsonl has."""
from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import load_config, wandb_history
from mlflow.tracking import MlflowClient

from snnjax.train import Trainer


def same(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]]) -> bool:
    """The same steps and keys, values equal to float32 rounding (MLflow stores doubles, wandb JSON text)."""
    return got.keys() == want.keys() and all(got[s] == pytest.approx(want[s], rel=1e-6) for s in want)


def test_wandb_and_mlflow_hold_the_same_scalars_as_metrics_jsonl(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"  # nothing may land in the working directory
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    c = load_config("digits", "--config.log_to=tensorboard,wandb,mlflow", "--config.monitor.firing_rates=True",
                    num_steps=4, log_every_steps=2, eval_every_steps=2)
    Trainer(c, tmp_path).run()
    logged: dict[int, dict[str, float]] = {}
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        logged.setdefault(row.pop("step"), {}).update({k: v for k, v in row.items() if isinstance(v, (int, float))})
    assert any(k.startswith("firing_rate/") for k in logged[4]) and "train_loss" in logged[2]

    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    in_wandb: dict[int, dict[str, float]] = {}
    for row in wandb_history(run_file):
        in_wandb.setdefault(int(row.pop("_step")), {}).update(row)
    assert same(in_wandb, logged)

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("snnjax").experiment_id])
    in_mlflow: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(run.info.run_id, key):
            in_mlflow.setdefault(m.step, {})[key] = m.value
    assert same(in_mlflow, logged)
    assert run.info.run_name == tmp_path.name
    assert json.loads(next(tmp_path.glob("mlartifacts/*/artifacts/config.json")).read_text())["num_steps"] == 4
    assert not any(cwd.iterdir())


def test_an_unknown_or_missing_tracker_is_refused_with_what_to_do(monkeypatch):
    with pytest.raises(ValueError, match="unknown tracker 'comet'"):
        Trainer(load_config("digits", "--config.log_to=tensorboard,comet", num_steps=1), "unused")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ValueError, match=r"wandb is not installed; pip install 'snnjax\[wandb\]'"):
        Trainer(load_config("digits", "--config.log_to=wandb", num_steps=1), "unused")
