"""Prediction from a trained run: the training's eval accuracy reproduced on 1 and 8 devices, and the CLI."""
import json
import pathlib

import jax
import numpy as np
import pytest

from snnjax import predict as predict_lib
from snnjax.train import config as config_lib
from snnjax.train import train_and_evaluate
from snnjax.train.checkpoint import CheckpointError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def digits_config(**overrides):
    c = config_lib.load(ROOT / "configs" / "digits.py")
    c.num_steps, c.log_every_steps, c.checkpoint_every_steps = 12, 6, 6
    for k, v in overrides.items():
        c[k] = v
    return c


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A short digits run on data=8 (the default mesh): its workdir and summary."""
    workdir = tmp_path_factory.mktemp("digits")
    return workdir, train_and_evaluate(digits_config(), workdir)


@pytest.mark.parametrize("num_devices", [1, 8])
def test_predictions_reproduce_the_runs_eval_accuracy(run, num_devices):
    workdir, summary = run
    preds = predict_lib.predict(workdir, "test", devices=jax.devices()[:num_devices])
    assert preds.step == 12 and preds.labels.shape == (359,)
    assert preds.accuracy == summary["eval_accuracy"]
    assert preds.logits.shape == (359, 4, 10)
    np.testing.assert_allclose(preds.probabilities.sum(-1), 1.0, rtol=1e-12)
    assert np.array_equal(preds.predictions, preds.logits.mean(1).argmax(-1))


def test_cli_writes_one_line_per_example_with_spike_counts(run, tmp_path, capsys):
    workdir, summary = run
    out = tmp_path / "preds.jsonl"
    assert predict_lib.main(["--workdir", str(workdir), "--out", str(out), "--dump-spikes", "--checkpoint", "12"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 359 and sum(r["correct"] for r in rows) / 359 == summary["eval_accuracy"]
    assert set(rows[0]) == {"index", "label", "prediction", "correct", "probabilities", "logits", "spike_counts"}
    assert list(rows[0]["spike_counts"]) == ["neurons.0"]
    counts = np.array([r["spike_counts"]["neurons.0"] for r in rows])
    assert counts.sum() > 0 and counts.max() <= 4 * 256  # T x hidden units bounds one example's spikes
    assert f"accuracy {summary['eval_accuracy']:.4f}" in capsys.readouterr().out


def test_an_earlier_checkpoint_and_bad_arguments(run, tmp_path):
    workdir, _ = run
    assert predict_lib.predict(workdir, checkpoint=6, devices=jax.devices()[:2]).step == 6
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 7 .* its steps are \[6, 12\]"):
        predict_lib.predict(workdir, checkpoint=7)
    with pytest.raises(ValueError, match="neither a split"):
        predict_lib.predict(workdir, "validation")
    with pytest.raises(ValueError, match="does not split over 3 devices"):
        predict_lib.predict(workdir, devices=jax.devices()[:3])
    with pytest.raises(FileNotFoundError, match="config.json"):
        predict_lib.predict(tmp_path)
