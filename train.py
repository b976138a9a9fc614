"""Train a spiking network: ``python train.py --config configs/NAME.py [--config.key=value ...] [--workdir DIR]``.

Exit status: 0 done; 1 an error (one line on stderr); 2 a bad flag; 143 / 130 stopped by SIGTERM / SIGINT
after saving a checkpoint (rerun with ``--config.resume=True`` to continue).
"""
from __future__ import annotations

import pathlib
import sys

from absl import app, flags, logging
from ml_collections import config_flags


def _bad_override(error: Exception, argv: list[str]) -> None:
    """A --config.KEY that names no key of the config: one line on stderr, exit status 2."""
    bad = [a for a in argv[1:] if a.startswith("--config.")]
    detail = " ".join(str(error).replace("\\n", " ").replace("\\'", "").replace("'", "").split())
    print(f"error: a --config override names no key of the config ({detail}); overrides given: {bad}",
          file=sys.stderr)
    sys.exit(2)


def _take_none_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(argv without its --config.KEY=None overrides, those KEYs)``: ml_collections parses a typed field's value
    with the field's type, so None (``--config.model.v_reset=None``: soft reset) is applied after parsing."""
    keys = [a.removeprefix("--config.").removesuffix("=None") for a in argv[1:]
            if a.startswith("--config.") and a.endswith("=None")]
    return [a for a in argv if not (a.startswith("--config.") and a.endswith("=None"))], keys


def _set_none(config, keys: list[str]) -> None:
    """Set each dotted ``key`` of ``config`` to None; a key the config lacks gets the one-line error."""
    for key in keys:
        *parents, leaf = key.split(".")
        node = config
        try:
            for part in parents:
                node = node[part]
            if leaf not in node:
                raise KeyError(f"flag --config.{key}=None: the config has no key {key}")
            with node.unlocked():
                node[leaf] = None
        except (KeyError, TypeError) as e:
            _bad_override(e, ["", *(f"--config.{k}=None" for k in keys)])


try:  # without --config, the default config file is loaded (and sys.argv's overrides applied) right here
    sys.argv, _IMPORT_NONE_KEYS = _take_none_overrides(sys.argv)
    _NONE_KEYS = _IMPORT_NONE_KEYS
    config_flags.DEFINE_config_file("config", str(pathlib.Path(__file__).parent / "configs" / "digits.py"),
                                    "Path to a config file (configs/*.py).", lock_config=True)
except (AttributeError, KeyError, TypeError, ValueError) as e:
    _bad_override(e, sys.argv)

flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and summary.json go (default: runs/<config name>).")
# A multi-process run (docs/multihost.md): all three, the same address and count in every process,
# or none (then $JAX_COORDINATOR_ADDRESS / $JAX_NUM_PROCESSES / $JAX_PROCESS_ID, a SLURM or Open MPI job, or one
# process). `python -m snnjax.launch` sets them for processes on this machine.
flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0, which serves the job's coordinator.")
flags.DEFINE_integer("num_processes", None, "Processes in the job.", lower_bound=1)
flags.DEFINE_integer("process_id", None, "This process, 0 .. num_processes-1.", lower_bound=0)
flags.DEFINE_float("collective_timeout_s", None, "Seconds after which a collective waiting on a dead or stuck "
                   "process is an error; the run then ends within about twice this (default: jax's, 100 s for a "
                   "dead process, 30 min for a stuck CPU collective).", lower_bound=0.001)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; options are --config, --config.KEY=VALUE, --workdir, "
                             "--coordinator_address, --num_processes, --process_id, --collective_timeout_s")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    config = FLAGS.config
    _set_none(config, _NONE_KEYS)
    # Imported here, not at the top: a bad flag fails before JAX loads, and malloc is set before JAX allocates.
    from snnjax.runtime import hostmem  # noqa: PLC0415

    hostmem.keep_freed_memory()  # reuse freed step buffers instead of re-faulting their pages each step
    from snnjax.runtime import distributed  # noqa: PLC0415

    try:  # before anything starts JAX's backend
        distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                               collective_timeout_s=FLAGS.collective_timeout_s)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    except RuntimeError as e:  # the coordinator cannot be reached
        print(f"error: {e}", file=sys.stderr)
        return 1
    import jax  # noqa: PLC0415

    if config.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    from snnjax.train import config as config_lib  # noqa: PLC0415
    from snnjax.train.checkpoint import CheckpointError  # noqa: PLC0415
    from snnjax.train.faults import NonFiniteError, Preempted  # noqa: PLC0415
    from snnjax.train.loop import train_and_evaluate  # noqa: PLC0415

    config_name = pathlib.Path(config_flags.get_config_filename(FLAGS["config"])).stem
    workdir = FLAGS.workdir or str(pathlib.Path("runs") / config_name)
    try:
        config_lib.validate(config)
        summary = train_and_evaluate(config, workdir)
    except Preempted as e:  # the run said where its checkpoint is and how to resume
        # 128 + signal (143 SIGTERM, 130 SIGINT), as a shell reports death by that signal; at once, within the
        # scheduler's grace period
        distributed.exit_now(e.exit_code)
    except (ValueError, FileNotFoundError, CheckpointError, NonFiniteError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if jax.process_index() == 0:
        trained = (f", train_loss {summary['train_loss']:.4f}, {summary['samples_per_sec']:.0f} samples/s"
                   if summary["train_loss"] is not None else " (nothing left to train)")
        skipped = f", {summary['skipped_steps']} non-finite steps skipped" if summary["skipped_steps"] else ""
        print(f"done: eval_accuracy {summary['eval_accuracy']:.4f}{trained}{skipped}; summary in "
              f"{workdir}/summary.json")
    return 0


def parse_flags(argv: list[str]) -> list[str]:
    """Parse flags (a bad flag or --config.KEY gets a one-line error, not a traceback); returns the remaining argv.

    ``--config.KEY=None`` overrides are kept aside and applied by ``main``."""
    global _NONE_KEYS
    argv, keys = _take_none_overrides(argv)
    _NONE_KEYS = [*_IMPORT_NONE_KEYS, *keys]
    sys.argv = _take_none_overrides(sys.argv)[0]  # config_flags finds the override flags in sys.argv
    try:
        return FLAGS(argv)
    except (AttributeError, KeyError, TypeError, ValueError, flags.Error) as e:
        if isinstance(e, flags.Error) and "config" not in str(e):  # another flag: absl's message names it
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            sys.exit(2)
        _bad_override(e, argv)


if __name__ == "__main__":
    try:
        sys.exit(main(parse_flags(sys.argv)))
    except app.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
