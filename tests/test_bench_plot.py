"""The distributed benchmark's charts and layout table, from records of tiny runs over the 8 test CPU devices."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from snnjax.bench import distributed, plot


@pytest.fixture(scope="module")
def records_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("plot") / "dist.jsonl"
    base = ["--model", "mlp", "--batch-size", "8", "--T", "2", "--steps", "1", "--warmup", "1", "--no-phases",
            "--out", str(out)]
    distributed.main([*base, "--mode", "none"])
    distributed.main([*base, "--mode", "dp", "--mesh", "data=8"])
    rec = distributed.main([*base, "--mode", "fsdp", "--mesh", "fsdp=8"])
    # The same key again, as a second run with a SpikingJelly comparison would write it.
    rec.update(step_latency_ms=2.0, spikingjelly_ms=6.0, spikingjelly_backend="torch",
               ratio_spikingjelly_over_ours=3.0)
    with open(out, "a") as f:
        f.write(json.dumps({"bench": "train_step", "median_ms": 1.0}) + "\n")  # another benchmark: skipped
        f.write(json.dumps(rec) + "\n")
    return out


def test_latest_record_of_each_key_is_kept(records_file):
    records = plot.load_records([str(records_file)])
    assert [r["mode"] for r in records] == ["none", "dp", "fsdp"]
    assert records[-1]["step_latency_ms"] == 2.0


def test_charts_are_written_with_a_row_per_record(records_file, tmp_path):
    paths = plot.main([str(records_file), "--out", str(tmp_path / "charts")])
    assert [p.rsplit("/", 1)[1] for p in paths] == ["throughput.png", "memory.png", "spikingjelly.png"]
    heights = {}
    for path in paths:
        with Image.open(path) as img:
            assert img.format == "PNG" and img.width == plot.LABEL_W + plot.BAR_W + plot.VALUE_W + 2 * plot.PAD
            heights[path.rsplit("/", 1)[1]] = img.height
    rows = lambda n: 2 * plot.PAD + plot.ROW_H * (n + 2)  # noqa: E731 (title gap, one section header)
    assert heights["throughput.png"] == rows(1 + 3)
    assert heights["memory.png"] == rows(1 + 2 * 3)
    assert heights["spikingjelly.png"] == rows(1 + 2)  # only the record with a comparison


def test_table_has_the_records_figures(records_file):
    records = plot.load_records([str(records_file)])
    lines = plot.layout_table(records).splitlines()
    assert len(lines) == 2 + 3 and lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    none, dp, fsdp = (line.split("|")[1:-1] for line in lines[2:])
    assert dp[1].strip() == "dp" and dp[2].strip() == "data=8" and fsdp[2].strip() == "fsdp=8"
    assert float(fsdp[3]) <= float(none[3]) / 8 * 1.05 + 1e-3  # parameters + optimizer per device
    assert float(dp[5]) == pytest.approx(records[1]["collectives"]["all-reduce"]["mb"], abs=1e-3)


def test_no_distributed_records_is_an_error(tmp_path):
    empty = tmp_path / "x.jsonl"
    empty.write_text(json.dumps({"bench": "neuron"}) + "\n")
    with pytest.raises(SystemExit, match="no snnjax.bench.distributed records"):
        plot.main([str(empty), "--out", str(tmp_path / "charts")])
