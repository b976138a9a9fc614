"""Train a spiking network: ``python train.py --config configs/NAME.py [--config.key=value ...] [--workdir DIR]``."""
from __future__ import annotations

import pathlib
import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", "configs/digits.py", "Path to a config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and summary.json go (default: runs/<config name>).")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are --config, --config.KEY=VALUE, --workdir")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    config = FLAGS.config
    # Imported here, not at the top: a bad flag fails before JAX loads, and malloc is set before JAX allocates.
    from snnjax import hostmem  # noqa: PLC0415

    hostmem.keep_freed_memory()  # reuse freed step buffers instead of re-faulting their pages each step
    import jax  # noqa: PLC0415

    if config.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    from snnjax.train import config as config_lib  # noqa: PLC0415
    from snnjax.train.checkpoint import CheckpointError  # noqa: PLC0415
    from snnjax.train.loop import train_and_evaluate  # noqa: PLC0415

    config_name = pathlib.Path(config_flags.get_config_filename(FLAGS["config"])).stem
    workdir = FLAGS.workdir or str(pathlib.Path("runs") / config_name)
    try:
        config_lib.validate(config)
        summary = train_and_evaluate(config, workdir)
    except (ValueError, FileNotFoundError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"done: eval_accuracy {summary['eval_accuracy']:.4f}, train_loss {summary['train_loss']:.4f}, "
          f"{summary['samples_per_sec']:.0f} samples/s; summary in {workdir}/summary.json")
    return 0


def parse_flags(argv: list[str]) -> list[str]:
    """Parse flags (a bad --config.KEY gets a one-line error, not a traceback); returns the remaining argv."""
    try:
        return FLAGS(argv)
    except (AttributeError, KeyError, TypeError, ValueError, flags.Error) as e:
        bad = [a for a in argv[1:] if a.startswith("--config.")]
        detail = " ".join(str(e).replace("\\n", " ").replace("\\'", "").replace("'", "").split())
        print(f"error: a --config override names no key of the config ({detail}); overrides given: {bad}",
              file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    try:
        sys.exit(main(parse_flags(sys.argv)))
    except app.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
