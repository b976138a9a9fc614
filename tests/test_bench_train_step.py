"""The train-step benchmark's code path on tiny models, one step, without SpikingJelly (no timings asserted)."""
from __future__ import annotations

import json
import math
import pathlib
import sys

import numpy as np
import pytest
from helpers import suite_cases

from snnjax.bench import peer, workload
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


TINY = [
    ("cifar10dvs_vgg", dict(widths=(4,) * 8)),
    ("spikformer_ti", dict(embed_dims=16, num_heads=2, depths=1, mlp_ratio=2.0)),
    ("sew_resnet18", dict(widths=(2, 2, 2, 2), stage_blocks=(1, 1, 1, 1))),
    ("dvsgesture_plif", dict(channels=2, hidden_features=4)),
    ("ms_resnet18", dict(base_channels=2, layers=(1, 1, 1, 1))),
]


# the suite: event frames and static images (SNNJAX_ALL_CASES=1: every model the bench times)
@pytest.mark.parametrize("model, overrides", suite_cases(TINY, TINY[:2]))
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



# Run as the SpikingJelly peers are: a script importing its sibling ``peer`` directly (the snnjax package, which
# imports JAX, stays out; the bench folder is put first on its path).
FAKE_PEER = '''
import sys, time
sys.path.insert(0, sys.argv.pop(1))
import peer

calls = []

def timed(_request):
    calls.append(time.perf_counter())
    return {"ms": float(len(calls))}

def boom(_request):
    raise RuntimeError("no such thing")

if "--fail" in sys.argv:
    sys.exit("cannot start: missing torch")
peer.serve({"time": timed, "boom": boom}, {"name": "fake", "argv": sys.argv[1:]})
'''


def _fake_peer(tmp_path, *args):
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE_PEER)
    return peer.Peer([sys.executable, str(script), str(pathlib.Path(peer.__file__).parent), *args])


def test_peer_protocol_answers_and_reports_errors(tmp_path):
    with _fake_peer(tmp_path, "--x") as p:
        assert p.ready == {"name": "fake", "argv": ["--x"]}
        assert [p.time_once() for _ in range(3)] == [1.0, 2.0, 3.0]
        with pytest.raises(peer.PeerError, match="RuntimeError: no such thing"):
            p.request("boom")
        with pytest.raises(peer.PeerError, match="unknown op 'nope'"):
            p.request("nope")
        assert p.time_once() == 4.0  # still serving after errors
    assert p.proc.returncode == 0
    with pytest.raises(peer.PeerError, match="cannot start: missing torch"):
        _fake_peer(tmp_path, "--fail")


def test_interleave_alternates_the_sides_every_repetition():
    order = []
    timers = {name: (lambda name=name: order.append(name) or 1.0) for name in ("ours", "sj:torch")}
    times = peer.interleave(timers, 4)
    assert order == ["ours", "sj:torch", "sj:torch", "ours", "ours", "sj:torch", "sj:torch", "ours"]
    assert times == {"ours": [1.0] * 4, "sj:torch": [1.0] * 4}


def test_workload_widths_divide_and_refuse_what_cannot():
    assert workload.architecture("cifar10dvs_vgg", 4, 8)["widths"] == (8, 16, 32, 32, 64, 64, 64, 64)
    assert workload.architecture("spikformer_ti", 4, 8)["embed_dims"] == 32
    assert workload.architecture("mlp", 4, 4)["hidden"] == (64,)
    with pytest.raises(ValueError, match="multiple of 8"):
        workload.architecture("spikformer_ti", 4, 64)


def test_compare_spikingjelly_with_a_missing_interpreter_records_the_error_and_profile_adds_a_trace(tmp_path):
    out = tmp_path / "bench.jsonl"
    rec = bench.main(["--model", "mlp", "--batch-size", "4", "--T", "2", "--steps", "2", "--warmup", "1",
                      "--compare-spikingjelly", "--sj-python", str(tmp_path / "none"), "--out", str(out),
                      "--profile", str(tmp_path / "trace")])
    assert "none" in rec["spikingjelly_error"] and rec["median_ms"] > 0
    assert rec["threads"]["schedulable_cores"] >= 1 and json.loads(out.read_text())["spikingjelly_error"]
    # --profile: one more step traced, its time split by op kind in the record
    assert rec["profile_trace"].startswith(str(tmp_path / "trace")) and rec["time_split_ms"]["matmul"] > 0


def test_config_mode_times_the_recipes_model_on_its_data(tmp_path):
    out = tmp_path / "bench.jsonl"
    rec = bench.main(["--config", "configs/shd_mlp.py", "--batch-size", "4", "--T", "3", "--steps", "1",
                      "--warmup", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == rec
    assert rec["model"] == "mlp" and rec["dataset"] == "shd" and rec["input_shape"] == [3, 4, 700]
    assert rec["num_params"] == 701 * 256 + 257 * 256 + 257 * 20 + 4 * 256  # 700-256-256-20, BatchNorm scale, bias
    assert rec["samples_per_s"] == pytest.approx(4000 / rec["median_ms"], rel=1e-3) and math.isfinite(rec["loss"])
