"""Charts and the layout table of the distributed benchmark's records.

    python -m snnjax.bench.plot FILE.jsonl [FILE.jsonl ...] --out DIR [--table]

Reads ``snnjax.bench.distributed`` records (other benchmarks' lines are skipped), keeps the latest record of
each comparison key, and writes three PNG charts into DIR, one section per model:
- ``throughput.png``: global samples per second by mode and device count;
- ``memory.png``: compiled memory per device (MiB) by mode and device count, with the parameters +
  optimizer state per device beside it;
- ``spikingjelly.png``: step milliseconds, ours against SpikingJelly's, for the records that carry a
  comparison (the ratio printed beside them).
``--table`` also prints the Markdown table of ``layout_table`` (docs/layouts.md, "Choosing a layout"). Drawn with
Pillow (a dependency already), so no plotting library is needed.
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable

from snnjax.bench.common import read_jsonl
from snnjax.bench.distributed import MODES, comparison_key

ROW_H, LABEL_W, BAR_W, VALUE_W, PAD = 18, 300, 420, 150, 10
COLORS = {"ours": (76, 132, 200), "other": (230, 140, 60), "header": (30, 30, 30), "text": (40, 40, 40)}


def load_records(paths: Iterable[str]) -> list[dict]:
    """The distributed records of ``paths`` in file order, the latest of each comparison key only."""
    latest: dict[str, dict] = {}
    for path in paths:
        for rec in read_jsonl(path):
            if rec.get("bench") == "distributed":
                key = json.dumps(comparison_key(rec), sort_keys=True)
                latest.pop(key, None)  # re-inserted at the end: the order follows the latest runs
                latest[key] = rec
    return list(latest.values())


def _mesh(rec: dict) -> str:
    return ",".join(f"{a}={s}" for a, s in rec["mesh"].items() if s > 1) or "1 device"


def _mode(rec: dict) -> str:
    return rec["mode"] + (f"->{rec['mode_chosen']}" if rec["mode"] == "auto" else "")


def _model(rec: dict) -> str:
    div = rec.get("width_div", 1)
    return (rec["model"] + (f" (widths/{div})" if div != 1 else "") + f", N={rec['global_batch_size']} T={rec['T']}, "
            f"{rec['device_count']} {rec.get('platform', '')} devices")


def _sections(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for rec in records:
        out.setdefault(_model(rec), []).append(rec)
    return out


def bar_chart(title: str, sections: dict[str, list[tuple[str, list[tuple[float, str, str]]]]], path: str) -> None:
    """Horizontal bars: per section a header, per row a label and bars ``(value, text, color key)`` scaled to
    the section's largest value. Written as PNG to ``path``."""
    from PIL import Image, ImageDraw

    n_rows = sum(1 + sum(len(bars) for _, bars in rows) for rows in sections.values())
    height = PAD * 2 + ROW_H * (n_rows + 2)
    img = Image.new("RGB", (LABEL_W + BAR_W + VALUE_W + 2 * PAD, height), "white")
    draw = ImageDraw.Draw(img)
    draw.text((PAD, PAD), title, fill=COLORS["header"])
    y = PAD + 2 * ROW_H
    for name, rows in sections.items():
        draw.text((PAD, y), name, fill=COLORS["header"])
        y += ROW_H
        top = max((v for _, bars in rows for v, _, _ in bars), default=0) or 1.0
        for label, bars in rows:
            for i, (value, text, color) in enumerate(bars):
                if i == 0:
                    draw.text((PAD + 10, y + 3), label[:48], fill=COLORS["text"])
                width = max(int(BAR_W * value / top), 1)
                draw.rectangle([LABEL_W, y + 2, LABEL_W + width, y + ROW_H - 3], fill=COLORS[color])
                draw.text((LABEL_W + width + 5, y + 3), text, fill=COLORS["text"])
                y += ROW_H
    img.save(path, format="PNG")


def throughput_chart(records: list[dict], path: str) -> None:
    """Global samples / s by mode and device count, one section per model."""
    sections = {name: [(f"{_mode(r)} [{_mesh(r)}] {r['device_count']} dev",
                        [(r["global_throughput_sps"], f"{r['global_throughput_sps']:.0f}/s", "ours")])
                       for r in recs] for name, recs in _sections(records).items()}
    bar_chart("Global throughput (samples/s) by mode, mesh and device count", sections, path)


def memory_chart(records: list[dict], path: str) -> None:
    """Compiled MiB per device and parameter + optimizer MiB per device, by mode and device count."""
    sections = {}
    for name, recs in _sections(records).items():
        rows = []
        for r in recs:
            total = r["compiled_memory_mb"].get("total") or 0.0
            state = r["state_mb"]["param"] + r["state_mb"]["optimizer"]
            rows.append((f"{_mode(r)} [{_mesh(r)}]", [(total, f"{total:.2f} MiB compiled", "ours"),
                                                      (state, f"{state:.3f} MiB params+opt", "other")]))
        sections[name] = rows
    bar_chart("Memory per device (MiB): compiled step (blue), parameters + optimizer state (orange)", sections, path)


def comparison_chart(records: list[dict], path: str) -> None:
    """Step ms, ours (blue) against SpikingJelly's single-device step (orange), with the ratio."""
    sections = {}
    for name, recs in _sections([r for r in records if r.get("spikingjelly_ms")]).items():
        sections[name] = [(f"{_mode(r)} [{_mesh(r)}]",
                           [(r["step_latency_ms"], f"ours {r['step_latency_ms']:.1f} ms", "ours"),
                            (r["spikingjelly_ms"], f"SJ {r['spikingjelly_backend']} {r['spikingjelly_ms']:.1f} ms "
                             f"({r['ratio_spikingjelly_over_ours']:.2f}x)", "other")]) for r in recs]
    bar_chart("Step time (ms): snnjax (blue) vs SpikingJelly on one device (orange); SJ/ours in brackets",
              sections or {"no records with a SpikingJelly comparison": []}, path)


def layout_table(records: list[dict]) -> str:
    """Markdown: per model and mode, the mesh, per-device parameters + optimizer and compiled memory, collective
    MiB per step, step time and throughput."""
    head = ("| model | mode | mesh | params+opt MiB/dev | compiled MiB/dev | all-reduce MiB | all-gather MiB "
            "| reduce-scatter MiB | ms/step | samples/s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    sections = list(dict.fromkeys(_model(r) for r in records))
    order = lambda r: (sections.index(_model(r)), MODES.index(r["mode"]) if r["mode"] in MODES else len(MODES))  # noqa: E731
    for r in sorted(records, key=order):
        mb = lambda kind, r=r: r["collectives"].get(kind, {}).get("mb", 0.0)  # noqa: E731
        state = r["state_mb"]["param"] + r["state_mb"]["optimizer"]
        lines.append(f"| {_model(r)} | {_mode(r)} | {_mesh(r)} | {state:.3f} | "
                     f"{r['compiled_memory_mb'].get('total', 0.0):.2f} | {mb('all-reduce'):.3f} | "
                     f"{mb('all-gather'):.3f} | {mb('reduce-scatter'):.3f} | {r['step_latency_ms']:.1f} | "
                     f"{r['global_throughput_sps']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[str]:
    """Write the charts; returns their paths."""
    p = argparse.ArgumentParser(prog="python -m snnjax.bench.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="JSONL files of snnjax.bench.distributed")
    p.add_argument("--out", required=True, help="folder for the PNG charts")
    p.add_argument("--table", action="store_true", help="also print the Markdown layout table")
    p.add_argument("--device-count", type=int, help="only the records of runs over this many devices")
    args = p.parse_args(argv)
    records = [r for r in load_records(args.files) if args.device_count in (None, r["device_count"])]
    if not records:
        raise SystemExit(f"no snnjax.bench.distributed records in {', '.join(args.files)}")
    os.makedirs(args.out, exist_ok=True)
    paths = []
    for name, chart in (("throughput", throughput_chart), ("memory", memory_chart),
                        ("spikingjelly", comparison_chart)):
        paths.append(os.path.join(args.out, f"{name}.png"))
        chart(records, paths[-1])
        print(f"wrote {paths[-1]}")
    if args.table:
        print(layout_table(records))
    return paths


if __name__ == "__main__":
    main()
