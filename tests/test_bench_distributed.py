"""The distributed benchmark on the tiny MLP over the 8 test CPU devices: records, comparisons, errors."""
from __future__ import annotations

import json
import math

import pytest
from helpers import sj_python

from snnjax.bench import distributed as bench

REQUIRED = ("benchmark_regime", "global_batch_size", "per_rank_batch_size", "data_replicas", "step_latency_ms",
            "global_throughput_sps", "per_device_throughput_sps", "peak_allocated_mb", "compiled_memory_mb",
            "optimize_ms", "forward_ms", "backward_ms", "optimizer_ms", "collectives", "recompile_count",
            "warning_count", "timestamp", "device_kind", "device_count", "process_count", "model", "mode",
            "mode_chosen", "mesh", "T", "dtype", "compile_ms", "jax_version", "git_commit", "previous")


def _run(out, *extra):
    argv = ["--model", "mlp", "--batch-size", "8", "--T", "2", "--steps", "2", "--warmup", "1", "--out", str(out)]
    return bench.main([*argv, *extra])


def _used_axes(rec):
    return {a: s for a, s in rec["mesh"].items() if s > 1}


def _records(out):
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_dp_record_has_every_field_and_consistent_figures(tmp_path):
    out = tmp_path / "dist.jsonl"
    rec = _run(out, "--mode", "dp", "--mesh", "data=8")
    assert _records(out) == [json.loads(json.dumps(rec))]
    assert not set(REQUIRED) - set(rec)
    assert _used_axes(rec) == {"data": 8} and rec["mode_chosen"] == "dp"
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
    assert _used_axes(rec) == {"fsdp": 4, "tensor": 2} and rec["mesh"]["data"] == 1
    assert rec["data_replicas"] == 4 and rec["per_rank_batch_size"] == 2
    assert rec["collectives"]["all-gather"]["count"] >= 1  # FSDP gathers the parameters
    assert rec["forward_ms"] is None and rec["step_latency_ms"] > 0


def test_pipeline_record_carries_its_schedule(tmp_path):
    rec = _run(tmp_path / "dist.jsonl", "--mode", "pp", "--mesh", "stage=2,data=4", "--pp-schedule", "zero_bubble")
    assert _used_axes(rec) == {"stage": 2, "data": 4} and rec["mode_chosen"] == "pp"
    assert rec["pp"]["schedule"] == "zero_bubble" and rec["pp"]["microbatches"] == 2 and sum(rec["pp"]["layout"]) == 2
    assert rec["collectives"]["collective-permute"]["count"] >= 2  # activations and cotangents between stages
    assert rec["forward_ms"] is None and math.isfinite(rec["loss"])


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
        _run(tmp_path / "x.jsonl", "--mode", "pipeline")
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run(tmp_path / "x.jsonl", "--mode", "pp")
    assert "--mode pp needs --mesh" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run(tmp_path / "x.jsonl", "--mode", "dp", "--image-size", "32")
    assert "--image-size" in capsys.readouterr().err


def test_layout_bytes_follow_the_mode(tmp_path):
    """fsdp=8 holds at most 1/8 (+5%) of the replicated parameters + optimizer state per device; dp's one
    gradient all-reduce moves the gradient's size (within 5%)."""
    out = tmp_path / "dist.jsonl"
    none = _run(out, "--mode", "none", "--no-phases")
    fsdp = _run(out, "--mode", "fsdp", "--mesh", "fsdp=8", "--no-phases")
    dp = _run(out, "--mode", "dp", "--mesh", "data=8", "--no-phases")
    state = lambda r: r["state_mb"]["param"] + r["state_mb"]["optimizer"]  # noqa: E731
    assert state(fsdp) <= state(none) / 8 * 1.05
    assert state(dp) == pytest.approx(state(none))
    grad_mb = none["state_mb"]["param"]  # float32 gradients: the parameters' size
    assert dp["collectives"]["all-reduce"]["count"] == 1
    assert dp["collectives"]["all-reduce"]["mb"] == pytest.approx(grad_mb, rel=0.05)
    assert none["collectives"]["all-reduce"]["count"] == 0


def test_spikingjelly_comparison_without_an_interpreter_records_why(tmp_path, capsys):
    rec = _run(tmp_path / "dist.jsonl", "--mode", "dp", "--mesh", "data=8", "--no-phases",
               "--compare-spikingjelly", "--sj-python", str(tmp_path / "no-such-python"))
    assert "no-such-python" in rec["spikingjelly_error"] and "spikingjelly_ms" not in rec
    assert rec["step_latency_ms"] > 0 and "SpikingJelly unavailable" in capsys.readouterr().out



@pytest.mark.skipif(sj_python() is None, reason="no interpreter with torch and spikingjelly (SNNJAX_SJ_PYTHON)")
def test_spikingjelly_comparison_is_interleaved_and_traceable(tmp_path):
    rec = _run(tmp_path / "dist.jsonl", "--mode", "dp", "--mesh", "data=8", "--no-phases", "--steps", "3",
               "--compare-spikingjelly", "--sj-python", sj_python(), "--sj-threads", "1")
    assert rec["spikingjelly_backend"] == "torch" and rec["timing"] == "interleaved"
    assert rec["torch_threads"] == 1 and rec["torch_version"] and rec["spikingjelly_version"]
    assert rec["threads"]["xla_intra_op_threads"] >= 1 and "8" in rec["threads"]["xla_flags"]
    assert rec["spikingjelly_devices"] == 1 and rec["spikingjelly_batch_size"] == rec["global_batch_size"]
    assert "mode dp" in rec["comparison"] and "8 cpu devices" in rec["comparison"]
    assert rec["spikingjelly_num_params"] == rec["num_params"]  # the same architecture
    assert math.isclose(rec["ratio_spikingjelly_over_ours"], rec["spikingjelly_ms"] / rec["step_latency_ms"])
    assert math.isclose(rec["spikingjelly_throughput_sps"], 8 / rec["spikingjelly_ms"] * 1e3)
