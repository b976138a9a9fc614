"""Profiler traces of chosen steps (``fit(profile_steps=...)``, ``config.profile_steps``) and their time split."""
from __future__ import annotations

import gzip
import json

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import load_config

import snnjax
from snnjax import layers
from snnjax.neurons import LIFNode
from snnjax.train import Trainer, profiling


def conv_net() -> snnjax.Sequential:
    rngs = nnx.Rngs(0)
    return snnjax.Sequential(layers.conv2d(2, 4, 3, padding=1, rngs=rngs), LIFNode(tau=2.0, step_mode="m"),
                             layers.Flatten(), layers.linear(4 * 8 * 8, 10, rngs=rngs))


def batches(n: int):
    rng = np.random.default_rng(0)
    return [{"inputs": (rng.random((3, 4, 8, 8, 2)) < 0.4).astype(np.float32), "labels": rng.integers(0, 10, 4)}
            for _ in range(n)]


def test_fit_traces_the_chosen_steps_and_splits_their_time(tmp_path):
    tr = snnjax.trainer(conv_net(), "data=1", devices=jax.devices()[:1], verbose=False)
    tr.fit(batches(3), progress=False, profile_steps=(2, 3), profile_dir=tmp_path)
    trace = tmp_path.glob("plugins/profile/*/perfetto_trace.json.gz")
    (trace,) = list(trace)
    assert tr.profile["trace"] == str(trace)
    with gzip.open(trace, "rt") as f:  # perfetto's JSON, as ui.perfetto.dev and TensorBoard read it
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    categories = profiling.op_categories(tr.compile(tr.put(batches(1)[0])).as_text())
    assert {"neuron", "convolution", "matmul"} <= set(categories.values())
    assert names & set(categories)  # the trace holds the compiled step's ops
    split = tr.profile["split"]
    assert split["neuron"] > 0 and split["convolution"] > 0 and split["traced"] > 0
    assert "traced" in profiling.format_split(split)


@pytest.mark.parametrize("value, want", [((), None), (3, (3, 3)), ((2, 4), (2, 4)), ("2,4", (2, 4))])
def test_profile_steps_values(value, want):
    assert profiling.parse_steps(value) == want


@pytest.mark.parametrize("value", [(0, 2), (4, 2), (1, 2, 3), ("a",)])
def test_bad_profile_steps_name_the_argument(value):
    with pytest.raises(ValueError, match="profile_steps"):
        profiling.parse_steps(value)


def test_config_profile_steps_trace_and_log_the_split(tmp_path):
    c = load_config("digits", "--config.profile_steps=2,3", num_steps=3, log_every_steps=3, eval_every_steps=3)
    Trainer(c, tmp_path).run()
    assert list(tmp_path.glob("profile/plugins/profile/*/perfetto_trace.json.gz"))
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (split,) = [r for r in logged if "profile/traced_ms" in r]
    assert split["step"] == 3 and split["profile/matmul_ms"] > 0 and split["profile/neuron_ms"] > 0
    c.profile_steps = (3, 4)
    with pytest.raises(ValueError, match=r"config.profile_steps=\(3, 4\) reaches past the run's last step 3"):
        Trainer(c, tmp_path / "again")
