"""``snnjax.bench.peers`` at toy sizes (no timings asserted).

- With no peer installed (CI): snnjax's step and its parts are timed and recorded, each peer is recorded
  unavailable with its reason, bad sizes and impls are refused naming the flag.
- With ``SNNJAX_SJ_PYTHON`` (torch + SpikingJelly; snnTorch and Norse too where installed there): snnjax's spikes
  equal SpikingJelly's and its weight and input gradients agree, for the linear and the conv workload.
"""
from __future__ import annotations

import json

import pytest
from helpers import sj_python

from snnjax.bench import peers as bench

TINY = ["--sizes", "2/4/16", "--image-size", "5", "--reps", "2", "--warmup", "1"]


def test_peers_bench_without_peers_records_ours_and_why_not(tmp_path):
    out = tmp_path / "peers.jsonl"
    missing = str(tmp_path / "no-such-python")
    records = bench.main([*TINY, "--impls", "xla", "--torch-python", missing, "--spyx-python", missing,
                          "--default-allocator", "--out", str(out)])
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
    (rec,) = records
    assert (rec["bench"], rec["workload"], rec["B"], rec["T"], rec["N"]) == ("peers", "linear", 2, 4, 16)
    assert set(rec["results"]) == {"snnjax", "snnjax:xla"} and rec["results"]["snnjax"]["median_ms"] > 0
    assert set(rec["unavailable"]) == set(bench.PEERS) and all("no-such-python" in why
                                                               for why in rec["unavailable"].values())
    assert rec["ratio_over_snnjax"] == {"snnjax:xla": pytest.approx(
        rec["results"]["snnjax:xla"]["median_ms"] / rec["results"]["snnjax"]["median_ms"])}
    for label in ("snnjax", "snnjax:xla"):
        p = rec["parts"][label]
        assert p["linear_ms"] > 0 and p["neuron_ms"] > 0
        assert p["linear_ms"] + p["neuron_ms"] + p["rest_ms"] == pytest.approx(rec["results"][label]["median_ms"])
    assert rec["check"] is None and rec["device_kind"] and len(rec["load_avg_before"]) == 3
    assert rec["threads"]["schedulable_cores"] >= 1 and rec["timing"] == "interleaved"
    assert rec["host_allocator"] == "default"


@pytest.mark.parametrize("args, message", [(["--sizes", "2/4"], "B/T/N"), (["--impls", "cuda"], "--impls")])
def test_peers_bench_refuses_bad_flags(args, message):
    with pytest.raises(SystemExit, match=message):
        bench.main([*TINY, *args, "--peers"])


@pytest.mark.skipif(sj_python() is None, reason="no interpreter with torch and spikingjelly (SNNJAX_SJ_PYTHON)")
def test_peers_bench_matches_spikingjelly():
    records = bench.main([*TINY, "--workloads", "linear", "conv", "--peers", "spikingjelly", "snntorch", "norse",
                          "--torch-python", sj_python(), "--threads", "1"])
    assert [r["workload"] for r in records] == ["linear", "conv"]
    for rec in records:
        assert "spikingjelly" in rec["results"] and rec["peers"]["spikingjelly"]["version"] == "2.0.0"
        assert rec["host_allocator"] == "keep_freed_memory"
        checked = {name: c for name, c in rec["check"].items() if name.startswith("snnjax") or name in rec["peers"]}
        assert "snnjax" in checked
        for c in checked.values():
            assert c["spike_mismatches"] == 0 and 0 < c["spikes"] == c["reference_spikes"]
            assert c["kernel_grad_rel_diff"] < 1e-5 and c["x_grad_rel_diff"] < 1e-5
