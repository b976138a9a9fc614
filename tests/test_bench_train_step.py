"""The train-step benchmark's code path on tiny models, one step, without SpikingJelly (no timings asserted)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from snnjax.bench import train_step as bench


def test_main_writes_a_record(tmp_path):
    out = tmp_path / "bench.jsonl"
    bench.main(["--model", "mlp", "--batch-size", "4", "--T", "2", "--grad-accum", "2", "--steps", "1",
                "--warmup", "1", "--out", str(out)])
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["model"] == "mlp" and rec["batch"] == 4 and rec["T"] == 2 and rec["grad_accum"] == 2
    assert rec["input_shape"] == [2, 4, 64] and rec["dtype"] == "float32" and rec["device_kind"]
    assert rec["median_ms"] > 0 and rec["compile_s"] > 0 and math.isfinite(rec["loss"])
    assert "spikingjelly_ms" not in rec and "git_commit" in rec


@pytest.mark.parametrize("model, overrides", [
    ("cifar10dvs_vgg", dict(widths=(4,) * 8)),
    ("spikformer_ti", dict(embed_dims=16, num_heads=2, depths=1, mlp_ratio=2.0)),
])
def test_tiny_models_run_one_step(model, overrides):
    res = bench.time_ours(model, 2, 2, 1, steps=1, warmup=1, **overrides)
    assert res["median_ms"] > 0 and math.isfinite(res["loss"]) and res["num_params"] > 0


def test_batches_are_seeded_time_major():
    x, y = bench.make_batch("cifar10dvs_vgg", 3, 2)
    x2, _ = bench.make_batch("cifar10dvs_vgg", 3, 2)
    assert x.shape == (2, 3, 48, 48, 2) and x.dtype == np.float32 and y.shape == (3,)
    np.testing.assert_array_equal(x, x2)
    img, _ = bench.make_batch("spikformer_ti", 2, 3)
    np.testing.assert_array_equal(img[0], img[2])  # a static image repeated over T

