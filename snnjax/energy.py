"""Synaptic operations and energy per inference: ``python -m snnjax.energy --config configs/X.py`` or ``--workdir RUN``.

Runs the model on the first ``--batches`` test batches of its dataset and prints, per conv / linear
layer, the spike-driven accumulates (AC) and real-valued multiply-accumulates (MAC) per example,
the input firing rate, and the energy estimate ``AC * e_ac + MAC * e_mac`` (defaults 0.9 pJ and 4.6 pJ:
45 nm, 32-bit float, Horowitz ISSCC 2014). The counting rules are in ``snnjax.deploy.opcount``.
``--workdir RUN [--checkpoint STEP]`` counts a trained run (firing rates depend on the weights);
``--config FILE [--config.KEY=VALUE ...]`` the freshly initialised model of a config.
``--out FILE`` also writes the report as JSON. Python: ``snnjax.deploy.opcount.count_ops(model, x)``.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence

import jax
from absl import flags
from ml_collections import config_flags

from snnjax.data import Loader
from snnjax.deploy.opcount import E_AC_PJ, E_MAC_PJ, LayerOps, OpReport, count_ops
from snnjax.deploy.run import build_model, load_run, make_source, read_config
from snnjax.train import config as config_lib
from snnjax.train.step import model_inputs


def energy_report(model, step_config, source, *, batch_size: int, batches: int = 1) -> OpReport:
    """:func:`count_ops` over the first ``batches`` batches of ``source`` (dataset order, inputs encoded as in
    evaluation), averaged per example."""
    loader = Loader(source, batch_size, shuffle=False, drop_remainder=True, process_index=0, process_count=1,
                    prefetch=0)
    if batches > loader.steps_per_epoch:
        raise ValueError(f"--batches={batches}: the test split has {loader.steps_per_epoch} full batches of "
                         f"{batch_size}")
    reports = []
    for i, batch in enumerate(loader.epoch_batches(0)):
        if i == batches:
            break
        key = jax.random.fold_in(jax.random.key(step_config.seed + 1), i)
        reports.append(count_ops(model, model_inputs(step_config, jax.numpy.asarray(batch["inputs"]), key)))
    return _mean(reports)


def _mean(reports: Sequence[OpReport]) -> OpReport:
    n = sum(r.examples for r in reports)
    layers = []
    for rows in zip(*(r.layers for r in reports), strict=True):
        first = rows[0]
        avg = {f: sum(getattr(r, f) * rep.examples for r, rep in zip(rows, reports, strict=True)) / n
               for f in ("ac", "mac", "dense_ops", "spikes")}
        layers.append(LayerOps(first.name, first.kind, first.input, avg["ac"], avg["mac"], avg["dense_ops"],
                               avg["spikes"], first.input_size))
    return OpReport(layers, n)


def main(argv: Sequence[str] | None = None) -> int:
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "a config file (configs/*.py); the model is freshly initialised",
                                    flag_values=fv, lock_config=True)
    flags.DEFINE_string("workdir", None, "a training run's directory (config.json, checkpoints/)", flag_values=fv)
    flags.DEFINE_integer("checkpoint", None, "with --workdir: the checkpoint step (default: the latest)",
                         flag_values=fv)
    flags.DEFINE_integer("batch_size", 0, "examples per batch (0: the config's global_batch_size)", flag_values=fv)
    flags.DEFINE_integer("batches", 1, "test batches to measure", flag_values=fv)
    flags.DEFINE_float("e_ac", E_AC_PJ, "energy of one accumulate in pJ", flag_values=fv)
    flags.DEFINE_float("e_mac", E_MAC_PJ, "energy of one multiply-accumulate in pJ", flag_values=fv)
    flags.DEFINE_string("out", None, "also write the report to this JSON file", flag_values=fv)
    try:
        fv(["snnjax.energy", *(sys.argv[1:] if argv is None else argv)])
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if (fv.config is None) == (fv.workdir is None):
        print("error: give either --config FILE or --workdir RUN", file=sys.stderr)
        return 2
    try:
        c = fv.config if fv.workdir is None else read_config(fv.workdir)
        config_lib.validate(c)
        if c.dtype == "float64":
            jax.config.update("jax_enable_x64", True)
        if fv.workdir is not None:
            run = load_run(fv.workdir, fv.checkpoint)
            model, step_cfg, what = run.model, run.step_config, f"{fv.workdir} checkpoint {run.step}"
        else:
            (model, step_cfg), what = build_model(c), f"{c.model.name} at initialisation"
        report = energy_report(model, step_cfg, make_source(c, "test"), batch_size=fv.batch_size or
                               c.global_batch_size, batches=fv.batches)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{what}, {c.data.name} test split:\n{report.table(fv.e_ac, fv.e_mac)}")
    if fv.out:
        with open(fv.out, "w") as f:
            json.dump({"layers": [dataclasses.asdict(r) for r in report.layers], "examples": report.examples,
                       "ac": report.ac, "mac": report.mac, "e_ac_pj": fv.e_ac, "e_mac_pj": fv.e_mac,
                       "energy_pj": report.energy_pj(fv.e_ac, fv.e_mac)}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
