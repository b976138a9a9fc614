"""The neuron benchmark and the compiled-kernel check, run small on the CPU (no timings are asserted).

- ``snnjax.bench.neuron``: records carry what the issue asks for (device kind, impl, T,
  shape, dtype, ms, GB/s against the 20 B per neuron-step floor, roofline fraction of the
  copy bandwidth measured in the same run), impls agree on spikes and gradient norm, and
  bad impl specs are refused with the valid choices.
- ``snnjax.bench.pallas_check``: one case runs end to end (interpret mode here) and passes, and
  a wrong kernel result is reported as a failure.
"""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sj_python

from snnjax import neurons as F
from snnjax.bench import neuron as bench
from snnjax.bench import pallas_check as check


def test_neuron_bench_records(tmp_path):
    out = tmp_path / "bench.jsonl"
    bench.main(["--ts", "2", "3", "--batch", "2", "--features", "40", "--impls", "xla", "scan", "user",
                "pallas:block_m=16,time_chunk=2", "--reps", "2", "--warmup", "1", "--copy-mib", "8",
                "--out", str(out)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["T"], r["impl"]) for r in records] == [
        (t, i) for t in (2, 3) for i in ("xla", "scan", "user", "pallas:block_m=16,time_chunk=2")]
    for r in records:
        assert r["device_kind"] and r["platform"] == "cpu" and r["dtype"] == "float32"
        assert r["shape"] == [r["T"], 2, 40] and r["min_bytes"] == 20 * r["T"] * 2 * 40
        assert r["median_ms"] > 0 and r["gb_per_s"] == pytest.approx(r["min_bytes"] / r["median_ms"] / 1e6)
        assert r["roofline_fraction"] == pytest.approx(r["gb_per_s"] / r["copy_gb_per_s"])
        assert r["copy_gb_per_s"] > 0 and r["copy_fresh_gb_per_s"] > 0
    for t in (2, 3):
        same_t = [r for r in records if r["T"] == t]
        assert len({r["spikes"] for r in same_t}) == 1 and same_t[0]["spikes"] > 0
        assert np.ptp([r["dx_norm"] for r in same_t]) <= 1e-5 * same_t[0]["dx_norm"]


def test_neuron_bench_inputs_are_seeded_and_fire():
    x, ds = bench.make_inputs(4, 3, 50)
    x2, ds2 = bench.make_inputs(4, 3, 50)
    assert x.dtype == ds.dtype == np.float32 and x.shape == (4, 3, 50)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(ds, ds2)
    spikes, _ = F.multistep(F.NeuronConfig(), jnp.asarray(x))
    assert 0.05 < float(jnp.mean(spikes)) < 0.5


@pytest.mark.parametrize("spec, message", [("cuda", "unknown impl"), ("pallas:block=8", "bad KernelOptions item"),
                                           ("pallas:block_m=big", "key=integer"),
                                           ("xla:block_m=8", "unknown impl")])
def test_neuron_bench_rejects_bad_impls(spec, message):
    with pytest.raises(SystemExit, match=message):
        bench.parse_impl(spec)


def test_kernel_check_runs_a_case_and_catches_a_wrong_kernel(monkeypatch):
    cfg, dtype, return_v_seq, random_v_init = next(check.cases())
    rec = check.check_case(cfg, dtype, return_v_seq, random_v_init, check.P.DEFAULT, seed=0)
    assert rec["ok"] and rec["spike_mismatch"] == 0 and 0 < rec["fire_rate"] < 1

    real = check.P.multistep

    def off_by_a_little(*args, **kwargs):
        s, v = real(*args, **kwargs)
        return s, v * 1.01

    monkeypatch.setattr(check.P, "multistep", off_by_a_little)
    # return_v_seq=True: a new trace of the checker's jitted runner, which picks up the patched kernels
    rec = check.check_case(cfg, dtype, True, random_v_init, check.P.DEFAULT, seed=1)
    assert not rec["ok"] and rec["v"] > 1e-3



@pytest.mark.skipif(sj_python() is None, reason="no interpreter with torch and spikingjelly (SNNJAX_SJ_PYTHON)")
def test_neuron_bench_spikingjelly_side_matches_and_is_recorded(tmp_path):
    records = bench.main(["--ts", "2", "3", "--batch", "2", "--features", "40", "--impls", "xla", "--reps", "2",
                          "--warmup", "1", "--copy-mib", "8", "--compare-spikingjelly", "--sj-python", sj_python(),
                          "--sj-threads", "1"])
    assert [r["T"] for r in records] == [2, 3]
    for r in records:
        assert r["spikingjelly_backend"] == "cpu" and r["timing"] == "interleaved" and r["torch_threads"] == 1
        assert r["spikingjelly_spikes_match"] and r["spikingjelly_dx_norm_rel_diff"] < 1e-5
        assert r["spikingjelly_ms"] > 0 and r["torch_version"] and r["spikingjelly_version"] == "2.0.0"
        assert r["threads"]["schedulable_cores"] >= 1


def test_neuron_bench_times_a_catalogue_neuron():
    """``--neuron KLIFNode``: the timed call gives the outputs, dX and its learned ``k``'s gradient; a readout's on
    ``assoc`` gives its ``scan`` path's."""
    x, ds = map(jnp.asarray, bench.make_inputs(3, 2, 40))
    summary = bench.summarize(*bench.catalogue_step("KLIFNode", 3)(x, ds))
    assert summary["spikes"] > 0 and summary["dx_norm"] > 0 and set(summary["dparams"]) == {"k"}
    assoc, scan = (bench.summarize(*bench.catalogue_step("NonSpikingLIFNode", 3, impl)(x, ds))
                   for impl in ("assoc", "scan"))
    assert assoc["dx_norm"] == pytest.approx(scan["dx_norm"], rel=1e-6) and assoc["dx_norm"] > 0
    with pytest.raises(SystemExit, match="--neuron CUBALIFNode runs on the impls auto, scan"):
        bench.main(["--neuron", "CUBALIFNode", "--impls", "xla"])


@pytest.mark.skipif(sj_python() is None, reason="no interpreter with torch and spikingjelly (SNNJAX_SJ_PYTHON)")
@pytest.mark.parametrize("name", ["KLIFNode", "NonSpikingLIFNode"])
def test_neuron_bench_runs_spikingjelly_s_catalogue_class(name):
    records = bench.main(["--neuron", name, "--ts", "3", "--batch", "2", "--features", "40", "--reps", "2",
                          "--warmup", "1", "--copy-mib", "8", "--compare-spikingjelly", "--sj-python", sj_python(),
                          "--sj-threads", "1"])
    r = records[0]
    assert r["spikingjelly_spikes_match"] and r["spikingjelly_dx_norm_rel_diff"] < 1e-5 and r["spikingjelly_ms"] > 0
    assert r["spikingjelly_dparams"].keys() == r["dparams"].keys()
    for key, value in r["dparams"].items():
        assert value == pytest.approx(r["spikingjelly_dparams"][key], rel=1e-4)


def test_neuron_bench_without_spikingjelly_says_so(tmp_path, capsys):
    records = bench.main(["--ts", "2", "--batch", "2", "--features", "40", "--impls", "xla", "--reps", "2",
                          "--warmup", "1", "--copy-mib", "8", "--compare-spikingjelly",
                          "--sj-python", str(tmp_path / "none")])
    assert "spikingjelly_ms" not in records[0] and "none" in records[0]["spikingjelly_errors"]["cpu"]
    assert "SpikingJelly cpu: unavailable" in capsys.readouterr().out
