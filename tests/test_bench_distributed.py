"""The distributed benchmark on the tiny MLP over the 8 test CPU devices: records, comparisons, errors."""
from __future__ import annotations

import json
import math

import pytest

from snnjax.bench import distributed as bench

REQUIRED = ("benchmark_regime", "global_batch_size", "per_rank_batch_size", "data_replicas", "step_latency_ms",
            "global_throughput_sps", "per_device_throughput_sps", "peak_allocated_mb", "compiled_memory_mb",
            "optimize_ms", "forward_ms", "backward_ms", "optimizer_ms", "collectives", "recompile_count",
            "warning_count", "timestamp", "device_kind", "device_count", "process_count", "model", "mode",
            "mode_chosen", "mesh", "T", "dtype", "compile_ms", "jax_version", "git_commit", "previous")


def _run(out, *extra):
    argv = ["--model", "mlp", "--batch-size", "8", "--T", "2", "--steps", "2", "--warmup", "1", "--out", str(out)]
    return bench.main([*argv, *extra])


def _records(out):
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_dp_record_has_every_field_and_consistent_figures(tmp_path):
    out = tmp_path / "dist.jsonl"
    rec = _run(out, "--mode", "dp", "--mesh", "data=8")
    assert _records(out) == [json.loads(json.dumps(rec))]
    assert not set(REQUIRED) - set(rec)
    assert rec["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1, "stage": 1} and rec["mode_chosen"] == "dp"
    assert rec["global_batch_size"] == 8 and rec["per_rank_batch_size"] == 1 and rec["data_replicas"] == 8
    assert rec["device_count"] == 8 and rec["process_count"] == 1 and rec["previous"] is None
    assert math.isclose(rec["global_throughput_sps"], 8 / rec["step_latency_ms"] * 1e3)
    assert math.isclose(rec["per_device_throughput_sps"], rec["global_throughput_sps"] / 8)
    assert rec["collectives"]["all-reduce"]["count"] >= 1 and rec["collectives"]["all-reduce"]["mb"] > 0
    assert rec["compiled_memory_mb"]["total"] > 0 and rec["compile_ms"] > 0 and rec["optimize_ms"] > 0
    assert rec["forward_ms"] > 0 and math.isclose(rec["forward_ms"] + rec["backward_ms"] + rec["optimizer_ms"],
                                                  rec["step_latency_ms"])
    assert rec["recompile_count"] == 0 and rec["warning_count"] >= 0 and math.isfinite(rec["loss"])


def test_fsdp_tp_record(tmp_path):
    rec = _run(tmp_path / "dist.jsonl", "--mode", "fsdp_tp", "--mesh", "fsdp=4,tensor=2", "--no-phases")
    assert rec["mesh"] == {"data": 1, "fsdp": 4, "tensor": 2, "stage": 1}
    assert rec["data_replicas"] == 4 and rec["per_rank_batch_size"] == 2
    assert rec["collectives"]["all-gather"]["count"] >= 1  # FSDP gathers the parameters
    assert rec["forward_ms"] is None and rec["step_latency_ms"] > 0


def test_second_run_compares_with_the_first_and_other_keys_do_not(tmp_path, capsys):
    out = tmp_path / "dist.jsonl"
    first = _run(out, "--mode", "dp_tp", "--mesh", "data=4,tensor=2", "--no-phases")
    other = _run(out, "--mode", "dp_tp", "--mesh", "data=4,tensor=2", "--no-phases", "--T", "3")
    assert other["previous"] is None  # T differs
    capsys.readouterr()
    second = _run(out, "--mode", "dp_tp", "--mesh", "data=4,tensor=2", "--no-phases")
    prev = second["previous"]
    assert prev["timestamp"] == first["timestamp"]
    expected = 100 * (second["step_latency_ms"] - first["step_latency_ms"]) / first["step_latency_ms"]
    assert math.isclose(prev["step_latency_pct"], expected)
    assert prev["compiled_memory_pct"] == pytest.approx(0.0, abs=1e-9)
    assert f"vs {first['timestamp']}: latency" in capsys.readouterr().out
    assert _records(out)[-1]["previous"] == prev


def test_weak_scaling_multiplies_the_batch_by_the_replicas(tmp_path):
    rec = _run(tmp_path / "dist.jsonl", "--mode", "hybrid", "--mesh", "data=2,fsdp=2,tensor=2",
               "--regime", "throughput_weak_scaling", "--batch-size", "3", "--no-phases")
    assert rec["global_batch_size"] == 12 and rec["per_rank_batch_size"] == 3 and rec["data_replicas"] == 4


@pytest.mark.parametrize("extra, match", [
    (("--mode", "dp", "--mesh", "data=3"), "needs 3 devices but 8 are available"),
    (("--mode", "dp", "--mesh", "data=8", "--batch-size", "6"), "does not divide over data x fsdp = 8"),
    (("--mode", "tp", "--mesh", "data=8"), "tensor"),
])
def test_bad_layouts_say_what_to_change(tmp_path, extra, match):
    out = tmp_path / "dist.jsonl"
    with pytest.raises(ValueError, match=match):
        _run(out, *extra)
    assert not out.exists()


def test_unknown_mode_and_mlp_image_size_are_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _run(tmp_path / "x.jsonl", "--mode", "pp")
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run(tmp_path / "x.jsonl", "--mode", "dp", "--image-size", "32")
    assert "--image-size" in capsys.readouterr().err
