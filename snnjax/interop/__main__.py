"""Command line of the interop package.

    python -m snnjax.interop check FILE.npz [--impl {auto,xla,pallas,native,scan}]

recomputes every case of a SpikingJelly reference file (``FILE.npz`` plus its sibling
``FILE.json``) in float64, prints one JSON line per case and ``{"cases": N, "failed": K}``,
and exits 1 on any failure (2 when the files are missing).
"""
from __future__ import annotations

import argparse
import sys

from snnjax.interop import check
from snnjax.neurons.kernels.dispatch import IMPLS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snnjax.interop")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("check", help="recompute a SpikingJelly reference file (FILE.npz + FILE.json) in float64")
    cmd.add_argument("file", help="the .npz file; its sibling .json describes the cases")
    cmd.add_argument("--impl", choices=IMPLS, default="auto",
                     help="the neurons' multi-step implementation (pallas runs interpreted on a CPU; native "
                          "is the CPU's C++ kernels)")
    args = parser.parse_args(argv)
    return check.check_file(args.file, impl=args.impl)


if __name__ == "__main__":
    sys.exit(main())
