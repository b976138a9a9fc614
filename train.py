"""Train a spiking network: ``python train.py --config configs/NAME.py [--config.key=value ...] [--workdir DIR]``.

The config is read by ``snnjax.train.config.load`` (the loader every command uses): ``--config.KEY=VALUE`` sets
an existing key, ``--config.KEY=None`` sets None (``--config.model.v_reset=None``: soft reset).
Exit status: 0 done; 1 an error (one line on stderr); 2 a bad flag; 143 / 130 stopped by SIGTERM / SIGINT
after saving a checkpoint (rerun with ``--config.resume=True`` to continue); 75 a checkpoint could not be written
(disk full, permissions: the earlier checkpoints are intact; fix the cause, then resume the same way).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

DEFAULT_CONFIG = pathlib.Path(__file__).parent / "configs" / "digits.py"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage text
        raise SystemExit(_usage_error(message))


def _usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``(flags, --config.KEY=VALUE overrides)`` of ``argv`` (without the program name)."""
    p = _Parser(prog="train.py", description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="a config file (configs/*.py) or a run's config.json")
    p.add_argument("--workdir", help="where checkpoints, metrics and summary.json go (default: runs/<config name>)")
    # A multi-process run (docs/multihost.md): all three, the same address and count in every process,
    # or none (then $JAX_COORDINATOR_ADDRESS / $JAX_NUM_PROCESSES / $JAX_PROCESS_ID, a SLURM or Open MPI job, or one
    # process). `python -m snnjax.launch` sets them for processes on this machine.
    p.add_argument("--coordinator_address", help="HOST:PORT of process 0, which serves the job's coordinator")
    p.add_argument("--num_processes", type=int, help="processes in the job")
    p.add_argument("--process_id", type=int, help="this process, 0 .. num_processes-1")
    p.add_argument("--collective_timeout_s", type=float, help="seconds after which a collective waiting on a dead or "
                   "stuck process is an error; the run then ends within about twice this (default: jax's, 100 s for "
                   "a dead process, 30 min for a stuck CPU collective)")
    args, rest = p.parse_known_args(argv)
    overrides, i = [], 0
    while i < len(rest):  # --config.KEY=VALUE, or --config.KEY VALUE
        arg = rest[i]
        if not arg.startswith("--config."):
            p.error(f"unexpected argument {arg!r}; options are --config, --config.KEY=VALUE, --workdir, "
                    "--coordinator_address, --num_processes, --process_id, --collective_timeout_s")
        if "=" not in arg and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            arg, i = f"{arg}={rest[i + 1]}", i + 1
        overrides.append(arg)
        i += 1
    for name, low in (("num_processes", 1), ("process_id", 0), ("collective_timeout_s", 0.001)):
        if getattr(args, name) is not None and getattr(args, name) < low:
            p.error(f"--{name}={getattr(args, name)}: must be >= {low}")
    return args, overrides


def main(argv: list[str]) -> int:
    args, overrides = parse_args(argv)
    from snnjax.train import config as config_lib  # noqa: PLC0415 (after the flags: --help needs no JAX)

    try:
        config = config_lib.load(args.config, overrides)
    except (FileNotFoundError, config_lib.ConfigError) as e:
        return _usage_error(str(e))
    from absl import logging  # noqa: PLC0415

    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    # Before JAX's backend starts: malloc's settings before it allocates, and the job's processes.
    from snnjax.runtime import hostmem  # noqa: PLC0415

    hostmem.keep_freed_memory()  # reuse freed step buffers instead of re-faulting their pages each step
    from snnjax.runtime import distributed  # noqa: PLC0415

    try:
        distributed.initialize(args.coordinator_address, args.num_processes, args.process_id,
                               collective_timeout_s=args.collective_timeout_s)
    except ValueError as e:
        return _usage_error(str(e))
    except RuntimeError as e:  # the coordinator cannot be reached
        print(f"error: {e}", file=sys.stderr)
        return 1
    import jax  # noqa: PLC0415

    if config.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    from snnjax.train.checkpoint import CheckpointError, CheckpointWriteError  # noqa: PLC0415
    from snnjax.train.faults import NonFiniteError, Preempted  # noqa: PLC0415
    from snnjax.train.loop import train_and_evaluate  # noqa: PLC0415

    workdir = args.workdir or str(pathlib.Path("runs") / pathlib.Path(args.config).stem)
    try:
        summary = train_and_evaluate(config, workdir)
    except Preempted as e:  # the run said where its checkpoint is and how to resume
        # 128 + signal (143 SIGTERM, 130 SIGINT), as a shell reports death by that signal; at once, within the
        # scheduler's grace period
        distributed.exit_now(e.exit_code)
    except CheckpointWriteError as e:  # stopped cleanly, resumable: the error names the checkpoints left
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
