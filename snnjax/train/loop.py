"""``train_and_evaluate(config, workdir)``: the training program behind ``train.py``.

``Trainer`` is the config's layer over the Python trainer (``snnjax.train.model_trainer.ModelTrainer``,
which holds the state and the jitted train and eval steps): it validates the config once, turns it into
plain values (mesh, data loaders, model, optimizer, plan, step settings, the run's logging and checkpoint
settings) and runs the loop: metrics, evaluation, checkpoints and the faults below.

Data order, dropout masks and Poisson spikes are pure functions of
``(seed, step)``, and checkpoints hold the optimizer state, so a run resumed
from a checkpoint continues the exact trajectory of an uninterrupted one.

Faults a long run meets:

* SIGTERM / SIGINT (preemption, Ctrl-C): the step under way finishes (with the
  logging, evaluation and checkpoint due at it), a checkpoint of that step is
  written and waited for, one line says how to resume, and ``run`` raises
  :class:`Preempted` (``train.py`` exits with ``128 + signal``: 143, 130). The
  resumed run continues the same trajectory bitwise. A second signal stops at
  once, as without these handlers. Several processes stop after the same step,
  within a few steps of the signal reaching any of them (``faults.StopSignals``).
* A restart by ``snnjax.runtime.launch --max-restarts`` (or a SLURM requeue): the run
  resumes from the latest complete checkpoint without ``resume=True``.
* A step whose loss or gradient norm is NaN/inf (``config.nonfinite``):
  ``"stop"`` raises :class:`NonFiniteError` naming the step, before anything
  after it is saved, and says whether that step's batch held NaN/inf inputs;
  ``"skip"`` applies no update at that step (the step counter still advances,
  so later steps read the same data) and counts it in ``skipped_steps``. The
  flags are read at each logging, evaluation and checkpoint step, not every step,
  so the loop does not wait for the device in between.
* Steps in flight: the loop dispatches steps ahead of the device, but waits for
  the step ``STEPS_IN_FLIGHT`` back before it goes on. Without that bound, a
  multi-process job with no host sync for long (large ``log_every_steps`` and
  ``checkpoint_every_steps``) queued dozens of steps, and 2 processes x 4 CPU
  devices over gloo deadlocked after 36-150 of them.
* A data file that turns out corrupt (``config.data.on_corrupt``): ``"error"`` stops
  the run with the reader's error naming the file; ``"skip"`` trains on the next
  readable example in its place, with a warning naming the file, and counts it
  (``snnjax.data.source.OnCorrupt``).
* A checkpoint that cannot be written (a full disk): ``checkpoint.CheckpointWriteError``
  naming the step and the complete checkpoints left, which the failure did not
  touch (``train.py`` exits 75: resumable once the cause is fixed).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import pathlib
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from tqdm.auto import tqdm

from snnjax import monitor, parallel
from snnjax.data import Loader, get_source
from snnjax.data.source import OnCorrupt
from snnjax.models import create_model, remat
from snnjax.models.registry import REGISTRY, DataShape, sizes_from_data
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import pipeline_plan
from snnjax.parallel import rules as rules_lib
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.runtime import distributed
from snnjax.train import config as config_lib
from snnjax.train import faults, memory_search, online, pipeline_memory, profiling
from snnjax.train import offload as offload_lib
from snnjax.train.checkpoint import Checkpointer, CheckpointError, complete_steps, set_aside
from snnjax.train.faults import NonFiniteError, Preempted
from snnjax.train.metrics import MetricWriter, parse_log_to
from snnjax.train.model_trainer import ModelTrainer, training_plan
from snnjax.train.optim import make_optimizer, make_schedule
from snnjax.train.step import StepConfig, model_inputs

__all__ = ["NonFiniteError", "Preempted", "Trainer", "train_and_evaluate"]

STEPS_IN_FLIGHT = 2  # steps dispatched but not finished: enough to keep the device fed, too few to deadlock
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}  # config.dtype -> compute dtype
_OFFLOADED = {"opt_state": "optimizer state", "params": "parameters (fetched per unit)",
              "all": "parameters (fetched per unit) and optimizer state"}

# -- the config's parts: each reads the config once and hands on plain values ---------------------


def make_sources(c: ml_collections.ConfigDict):
    """``(train, test)`` sources of ``c.data``; prints a note for each setting the dataset does not take."""
    kwargs, notes = config_lib.source_kwargs(c)
    if jax.process_index() == 0:
        for note in notes:
            print(f"note: {note}", flush=True)
    return tuple(get_source(c.data.name, split, **kwargs) for split in ("train", "test"))


def model_kwargs(c: ml_collections.ConfigDict, source) -> dict[str, Any]:
    """The config's model options, with input/output sizes filled in from the data where not set.

    A None option is passed on as None (``v_reset=None``: soft reset), except the sizes the data gives."""
    size_keys = REGISTRY[c.model.name].size_keys if c.model.name in REGISTRY else ()
    kwargs = {k: v for k, v in c.model.items() if k != "name" and not (v is None and k in size_keys)}
    sizes = sizes_from_data(c.model.name, DataShape.of(source, c.data.time_steps), kwargs)
    return {**sizes, **kwargs}


def init_model(c: ml_collections.ConfigDict, source) -> nnx.Module:
    """The config's model as a run initialises it: sizes from ``source``'s data, weights from ``c.seed``."""
    return create_model(c.model.name, model_kwargs(c, source), rngs=nnx.Rngs(params=c.seed, dropout=c.seed + 1),
                        dtype=DTYPES[c.dtype], param_dtype=jnp.float64 if c.dtype == "float64" else jnp.float32)


def step_config(c: ml_collections.ConfigDict, time_major: bool) -> StepConfig:
    """The run's step settings: how a batch's inputs become the model's ``[T, N, ...]`` (the data encoder unless
    the data is ``time_major`` event frames, the compute dtype), the loss, accumulation and non-finite steps."""
    return StepConfig(seed=c.seed, time_steps=c.data.time_steps, encoder=None if time_major else c.data.encoder,
                      loss=c.loss, tet_lambda=c.tet_lambda, grad_accum_steps=c.grad_accum_steps,
                      compute_dtype=DTYPES[c.dtype], skip_nonfinite=c.nonfinite == "skip",
                      method=c.train_method, online_updates=c.online_updates)


def make_mesh(mode: str, spec: str, *, zero_stage: int | None = None, sequence_parallel: bool = False):
    """The mesh of parallel ``mode`` over the mesh ``spec`` (one device for ``none``; None for ``auto``, whose plan
    picks it), checked against the mode."""
    if mode == "auto":
        return None
    if mode == "none":
        return mesh_lib.make_mesh("data=1", jax.devices()[:1])
    mesh = mesh_lib.make_mesh(spec)
    if mode == "pp":  # the plan checks the stage axis and the mode the other axes imply
        return mesh
    rules_lib.check_mesh(rules_lib.get_strategy(mode, zero_stage, sequence_parallel), dict(mesh.shape))
    return mesh


def search_memory(model: nnx.Module, plan: parallel.Plan, plan_for: Callable[[int], parallel.Plan],
                  step_cfg: StepConfig, tx, data: DataShape, *, global_batch_size: int, time_major: bool,
                  offload: str, budget_mb: float, pp: PipelineOptions, log: Callable[[str], None]):
    """Configure ``model`` with the fastest checkpointing plan whose compiled peak per device fits ``budget_mb``
    MiB (``snnjax.train.memory_search``), for each device's share of a microbatch; under ``plan``'s mode pp, with
    the microbatch count (``snnjax.train.pipeline_memory``; ``plan_for(M)``: the plan with M microbatches), for the
    whole step. ``offload``: the config's ``parallel.offload`` (``auto``: the search may offload the optimizer
    state). Returns the search's result."""
    accum = step_cfg.grad_accum_steps
    shards = plan.axis_sizes.get("data", 1) * plan.axis_sizes.get("fsdp", 1)
    is_pp = plan.mode == "pp"
    rows = global_batch_size // accum // (1 if is_pp else shards)
    lead = (data.time_steps, rows) if time_major else (rows,)
    batch = {"inputs": jax.ShapeDtypeStruct((*lead, *data.frame_shape), jnp.float32),
             "labels": jax.ShapeDtypeStruct((rows,), jnp.int32)}
    offloads = (offload,) if offload != "auto" else ("none", "opt_state")
    if offload == "auto" and not offload_lib.saves_device_memory():
        offloads = ("none",)
        log("note: parallel.offload=auto: host memory is the device's own memory on this backend, so the memory "
            "search does not offload")
    budget = int(budget_mb * 2**20)
    if is_pp:
        sizes = plan.axis_sizes
        times = [(pp.microbatches, 0.0)] if pp.microbatches > 0 else pipeline_plan.microbatch_options(
            rows, sizes["data"] * sizes["fsdp"], sizes["stage"], pp.virtual_stages, pp.schedule)
        axis = {"inputs": 1 if time_major else 0, "labels": 0}
        compile_for = pipeline_memory.step_compiler(
            model, step_cfg, tx, batch, plan_for,
            lambda p: {k: p.batch_sharding(v.ndim, axis[k]) for k, v in batch.items()})
        result = pipeline_memory.search([cand for o in offloads for cand in pipeline_memory.candidates(times, o)],
                                        compile_for, budget)
    else:
        inputs = None if time_major else jax.ShapeDtypeStruct((data.time_steps, rows, *data.frame_shape),
                                                              step_cfg.compute_dtype)
        result = memory_search.search_model(model, dataclasses.replace(step_cfg, grad_accum_steps=1), tx, batch,
                                            budget, inputs=inputs, offloads=offloads)
    log(result.summary() + (f" (per device: {rows} of the {global_batch_size} examples per step)"
                            if not is_pp and (shards > 1 or accum > 1) else ""))
    if result.chosen is None:
        fixes = ("raise parallel.pp.microbatches (smaller microbatches), lower global_batch_size, set "
                 "parallel.zero_stage=1 or 2 (optimizer state and gradients split over data within a stage), "
                 "or pipeline over more stages" if is_pp else
                 "lower global_batch_size or raise grad_accum_steps, or shard over more devices")
        raise ValueError(f"no checkpointing plan fits parallel.memory_budget_mb={budget_mb:g} (the smallest "
                         f"compiled peak is {min(m.peak_bytes for m in result.tried) / 2**20:,.1f} MiB per device): "
                         f"raise the budget, {fixes}")
    remat.configure(model, result.chosen.candidate.settings)
    return result


class Trainer:
    """A config's run on the Python trainer (``self.trainer``, a ``ModelTrainer``); ``run()`` trains, evaluates,
    checkpoints and writes the summary."""

    def __init__(self, c: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, model: nnx.Module | None = None):
        """``model``: train this ``nnx.Module`` (inputs ``[T, N, ...]``, logits ``[T, N, classes]``) instead of
        ``config.model`` (whose keys are then ignored); ``model()`` hands it back trained."""
        config_lib.validate(c)  # the one check: below, the config is read into plain values once
        self.workdir = pathlib.Path(workdir)
        self.is_main = jax.process_index() == 0
        p, batch, accum = c.parallel, c.global_batch_size, c.grad_accum_steps
        zero_stage = None if p.zero_stage == -1 else p.zero_stage
        # the run's own settings (logging, evaluation, checkpoints, faults)
        self.global_batch_size, self.data_name, self.dtype = batch, c.data.name, c.dtype
        self.log_every, self.checkpoint_every = c.log_every_steps, c.checkpoint_every_steps
        self.keep_checkpoints, self.resume = c.keep_checkpoints, c.resume
        self.skip_nonfinite, self.log_firing_rates = c.nonfinite == "skip", c.monitor.firing_rates
        self.print_summary, self.config_json = p.print_summary, c.to_json_best_effort(indent=2)
        self.profile_steps = profiling.parse_steps(c.profile_steps, name="config.profile_steps")
        self.log_to = parse_log_to(c.log_to)

        mesh = make_mesh(p.mode, p.mesh, zero_stage=zero_stage, sequence_parallel=p.sequence_parallel)
        if mesh is not None:
            mesh_lib.check_batch_divides(mesh, batch, accum)
        train_src, test_src = (OnCorrupt(source, c.data.on_corrupt, what=f"{c.data.name} {split}")
                               for source, split in zip(make_sources(c), ("training", "test"), strict=True))
        self.skip_corrupt = c.data.on_corrupt == "skip"
        time_major = train_src.time_steps is not None
        # Each process reads the rows its devices hold. Mode auto (mesh planned below) splits the batch outermost
        # over a multiple of the process count, where the default slice (process k of P) is those rows.
        rows = None if mesh is None else mesh_lib.batch_sharding(mesh, 1)
        self.train_loader = Loader(train_src, batch, seed=c.seed, shuffle=True, drop_remainder=True,
                                   prefetch=c.data.prefetch, batch_sharding=rows)
        self.eval_loader = Loader(test_src, batch, seed=c.seed, shuffle=False, drop_remainder=False,
                                  prefetch=c.data.prefetch, batch_sharding=rows)
        spe = self.train_loader.steps_per_epoch
        self.total_steps = c.num_steps if c.num_steps > 0 else c.num_epochs * spe
        if self.profile_steps and self.profile_steps[1] > self.total_steps:
            raise ValueError(f"config.profile_steps={tuple(c.profile_steps)} reaches past the run's last step "
                             f"{self.total_steps}: trace steps 1..{self.total_steps}")
        self.eval_every = c.eval_every_steps if c.eval_every_steps > 0 else spe

        self.model_name = c.model.name if model is None else type(model).__name__
        if model is None:
            model = init_model(c, train_src)
        settings = config_lib.remat_settings(c)
        if callable(getattr(model, "units", None)) or settings != remat.MemorySettings():
            remat.configure(model, settings)
        self.schedule = make_schedule(c.schedule, c.learning_rate, self.total_steps, c.warmup_steps)
        tx = make_optimizer(c.optimizer, self.schedule, weight_decay=c.weight_decay, momentum=c.momentum,
                            grad_clip_norm=c.grad_clip_norm)
        step_cfg = step_config(c, time_major)
        online.check_model(model, step_cfg.method)
        data = DataShape.of(train_src, c.data.time_steps)
        shaped = {"input_shape": (data.time_steps, batch, *data.frame_shape), "compute_dtype": step_cfg.compute_dtype}
        # pp, and auto (which may choose it unless the batch is accumulated), cost the stage split on the batch's
        # shape; time_blocks checks the block count against each layer on it; the printed plan traces the neurons
        # on it (which path runs each)
        pipeline = PipelineOptions(**p.pp) if p.mode == "pp" or (p.mode == "auto" and accum == 1) else None
        plan_options = dict(objective=p.objective, zero_stage=zero_stage, sequence_parallel=p.sequence_parallel,
                            global_batch_size=batch // accum, opt_slots=1 if c.optimizer == "sgd" else 2,
                            min_shard_size=p.min_shard_size,
                            memory_budget_bytes=int(p.memory_budget_mb * 2**20) or None,
                            time_steps=c.data.time_steps, time_blocks=p.time_blocks,
                            **shaped)
        plan = training_plan(model, mesh if mesh is not None else jax.device_count(), p.mode, pipeline=pipeline,
                             **plan_options)

        @functools.cache
        def plan_for(microbatches: int) -> parallel.Plan:  # the pipeline on the first plan's mesh, M microbatches
            pp = dataclasses.replace(pipeline, microbatches=microbatches)
            return training_plan(model, plan.mesh, "pp", pipeline=pp, **plan_options)

        self.offload = p.offload if p.offload != "auto" else "none"
        self.memory_search = None
        if p.memory_budget_mb > 0:
            self.memory_search = search_memory(model, plan, plan_for, step_cfg, tx, data, global_batch_size=batch,
                                               time_major=time_major, offload=p.offload,
                                               budget_mb=p.memory_budget_mb, pp=PipelineOptions(**p.pp), log=self._log)
            chosen = self.memory_search.chosen.candidate
            self.offload = chosen.offload
            if plan.mode == "pp":
                plan = plan_for(chosen.microbatches)
        plan = plan.with_offload(self.offload)
        if self.offload != "none" and not offload_lib.saves_device_memory(plan.mesh.devices.flat[0].platform):
            what = {"opt_state": "the optimizer state moves", "params": "the parameters move",
                    "all": "the parameters and the optimizer state move"}[self.offload]
            self._log(f"note: parallel.offload={self.offload}: on this backend host memory is the device's own memory, "
                      f"so {what} between memory kinds each step and no memory is saved")
        self.num_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        self.trainer = ModelTrainer(model, plan, tx, step_cfg, verbose=False)
        self.plan, self.mesh = plan, plan.mesh
        self.checkpointer = None
        self.skipped_steps = 0  # steps whose update was skipped (nonfinite="skip"), over the whole run
        self._signals = faults.StopSignals()  # SIGTERM / SIGINT handlers while run() trains

    def model(self) -> nnx.Module:
        """The model as trained so far (a new ``nnx.Module``; arrays placed as the plan stores them)."""
        return self.trainer.model()

    # -- checkpoints -------------------------------------------------------------------------

    def _open_checkpoints(self) -> None:
        ckpt_dir = self.workdir / "checkpoints"
        existing = bool(complete_steps(ckpt_dir))  # a failed first save leaves only a tmp folder: start afresh
        # A job the launcher restarted (or SLURM requeued) continues from its latest complete checkpoint.
        if self.resume or (existing and distributed.launch_info().restarted):
            if not existing:
                raise CheckpointError(f"resume=True but {ckpt_dir} holds no checkpoint; run without "
                                      "--config.resume=True to start fresh, or pass the run's --workdir (from Python: "
                                      "config.resume = False, or the run's directory as Trainer(config, workdir))")
            reader = Checkpointer(ckpt_dir, self.keep_checkpoints, read_only=True)
            tree_state, meta = reader.restore(self.trainer.tree_state())  # falls back past damaged steps
            self.trainer.set_tree_state(tree_state)
            reader.close()
            if reader.damaged:  # kept for inspection, out of the way of the steps this run saves again
                if jax.process_index() == 0:
                    moved = set_aside(ckpt_dir, reader.damaged)
                    self._log(f"checkpoint step(s) {reader.damaged} failed their checks and were renamed "
                              f"{[m.name for m in moved]}; continuing from step {int(jax.device_get(tree_state.step))}")
                if jax.process_count() > 1:
                    ocp.multihost.sync_global_processes("snnjax_set_aside")
            self.skipped_steps = int(meta.get("skipped_steps", 0))
            if meta.get("global_batch_size") != self.global_batch_size or meta.get("data") != self.data_name:
                raise CheckpointError(f"the checkpoint in {ckpt_dir} was written with global_batch_size="
                                      f"{meta.get('global_batch_size')} on {meta.get('data')!r}; this run uses "
                                      f"{self.global_batch_size} on {self.data_name!r}, so it cannot continue "
                                      "the same trajectory")
        elif existing:
            raise CheckpointError(f"{ckpt_dir} already holds checkpoints; pass --config.resume=True to continue that "
                                  "run, or choose another --workdir (nothing was overwritten). From Python: set "
                                  "config.resume = True, or pass another workdir to Trainer(config, workdir)")
        self.checkpointer = Checkpointer(ckpt_dir, self.keep_checkpoints, on_saved=self._signals.save_took)

    def _save(self) -> None:
        meta = {"global_batch_size": self.global_batch_size, "data": self.data_name,
                "skipped_steps": self.skipped_steps, "config": json.loads(self.config_json)}
        self.checkpointer.save(self.trainer.tree_state(), meta)

    def _close_checkpoints(self) -> None:
        """Wait for the last save (``CheckpointError`` if it failed) and release the checkpoint manager."""
        checkpointer, self.checkpointer = self.checkpointer, None
        if checkpointer is not None:
            checkpointer.close()

    def _kept(self) -> str:
        steps = complete_steps(self.workdir / "checkpoints")
        return (f"the complete checkpoints in {self.workdir / 'checkpoints'} are steps {steps}" if steps
                else f"{self.workdir / 'checkpoints'} holds no complete checkpoint")

    # -- faults ------------------------------------------------------------------------------

    def _stop(self, signum: int, done: int) -> None:
        """After the checkpoint of step ``done`` was saved: wait for it, say how to resume, raise ``Preempted``."""
        self.checkpointer.wait()
        self._signals.saved(done)
        message = (f"stopped by {signal.Signals(signum).name} after step {done} of {self.total_steps}: checkpoint "
                   f"{self.workdir / 'checkpoints' / str(done)} is on disk; to continue, rerun the same command "
                   "with --config.resume=True (from Python: config.resume = True, the same workdir)")
        self._log(message)
        raise faults.Preempted(message, signum=signum, step=done)

    def _check_finite(self, steps: list[tuple[int, dict[str, jax.Array]]], progress) -> None:
        """Read the finite flags of ``steps`` (1-based step, its metrics); stop at or count the non-finite ones."""
        if not steps:
            return
        flags = jax.device_get([m["finite"] for _, m in steps])
        for (done, m), finite in zip(steps, flags, strict=True):
            if finite:
                continue
            loss, norm = (float(jax.device_get(m[k])) for k in ("loss", "grad_norm"))
            what = (f"step {done}: the loss ({loss}) or the gradient norm ({norm}) is not finite. "
                    f"{faults.inputs_note(self.train_loader, self.data_name, done)}")
            if self.skip_nonfinite:
                self.skipped_steps += 1
                if self.is_main:
                    progress.write(f"{what} Its update was skipped (config.nonfinite='skip').")
                continue
            self.checkpointer.wait()
            raise faults.NonFiniteError(
                f"{what} Training stopped (config.nonfinite='stop'); nothing from step {done} on was saved, and "
                f"{self._kept()}, all from before it. Fix the data (or lower config.learning_rate / set "
                "config.grad_clip_norm) and rerun the same command with --config.resume=True, or add "
                "--config.nonfinite=skip to skip such steps (from Python: config.resume = True, config.nonfinite = "
                "'skip').")

    # -- evaluation --------------------------------------------------------------------------

    def firing_rates(self) -> dict[str, float]:
        """``firing_rate/<neuron path>``: each spiking neuron's spikes per neuron per step on the first eval batch
        (eval mode; ``snnjax.monitor``)."""
        batch = self.trainer.put(next(iter(self.eval_loader.epoch_batches(0))))
        step_cfg = self.trainer.step_config
        inputs = jax.jit(functools.partial(model_inputs, step_cfg))(batch["inputs"], jax.random.key(step_cfg.seed))
        return {f"firing_rate/{k}": v for k, v in monitor.firing_rates(self.model(), inputs).items()}

    def evaluate(self) -> dict[str, float]:
        """``eval_loss`` and ``eval_accuracy`` over the whole test split."""
        metrics = self.trainer.evaluate(self.eval_loader.epoch_batches(0))
        return {"eval_loss": metrics["loss"], "eval_accuracy": metrics["accuracy"]}

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Train to ``total_steps``, evaluate and write ``summary.json``; returns the summary.

        Raises:
          Preempted: SIGTERM/SIGINT arrived; the checkpoint of the last finished step is on disk.
          NonFiniteError: ``nonfinite="stop"`` and a step's loss or gradient norm was NaN/inf.
          CheckpointError: a checkpoint could not be restored or written (the complete ones are untouched).
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._open_checkpoints()
        writer = MetricWriter(self.workdir, enabled=self.is_main, log_to=self.log_to,
                              config=json.loads(self.config_json))
        try:
            with self._signals:
                summary = self._train(writer)
        except BaseException as error:
            # Complete a save still in flight, so a failure costs no more than the steps since it; but a
            # second signal (KeyboardInterrupt) asks to stop at once.
            if not isinstance(error, KeyboardInterrupt):
                try:
                    self._close_checkpoints()
                except Exception as also:  # noqa: BLE001 (reported; the first error is the one raised)
                    self._log(f"note: while stopping, {type(also).__name__}: {also}")
            raise
        finally:
            writer.close()
        if self.is_main:
            (self.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _train(self, writer: MetricWriter) -> dict[str, Any]:
        start = self.trainer.step_count
        if self.is_main:
            (self.workdir / "config.json").write_text(self.config_json)

        batches = self.train_loader.batches(start_step=start)
        first = self.trainer.put(next(batches))
        t0 = time.perf_counter()
        self.trainer.compile(first)
        compile_seconds = time.perf_counter() - t0
        mesh_desc = " x ".join(f"{k}={v}" for k, v in self.mesh.shape.items() if v > 1) or "1 device"
        self._log(f"{self.model_name}: {self.num_params:,} parameters; mode {self.plan.mode} on {mesh_desc}; "
                  f"{self.total_steps} steps of {self.global_batch_size} ({self.train_loader.steps_per_epoch}/epoch); "
                  f"compiled in {compile_seconds:.1f}s" + (f"; offloaded to host memory: {_OFFLOADED[self.offload]}"
                                                          if self.offload != "none" else "")
                  + (f"; resuming at step {start}" if start else ""))
        step_cost = self.trainer.cost()
        if self.print_summary:
            self._log(str(self.plan))
            self._log(parallel.format_report(step_cost, f"per-device cost of one train step ({self.plan.mode}, "
                                             f"{mesh_desc})"))

        progress = tqdm(total=self.total_steps, initial=start, disable=not self.is_main, unit="step",
                        dynamic_ncols=True)
        folder = self.workdir / "profile"
        profiler = profiling.StepProfiler(
            self.profile_steps, folder if jax.process_count() == 1 else folder / f"process_{jax.process_index()}")
        window, window_t, window_steps = [], time.perf_counter(), 0
        train_time, trained, last = 0.0, 0, {}
        eval_metrics: dict[str, float] = {}
        unchecked: list[tuple[int, dict[str, jax.Array]]] = []  # (step, metrics) whose finite flag is unread
        in_flight: collections.deque[jax.Array] = collections.deque()  # the losses of the steps not waited for
        batch, stop = first, None
        with progress, contextlib.closing(profiler) as profiler:
            for step in range(start, self.total_steps):
                t = time.perf_counter()
                profiler.before(step + 1)
                metrics = self.trainer.advance(batch)
                in_flight.append(metrics["loss"])
                if len(in_flight) > STEPS_IN_FLIGHT:
                    in_flight.popleft().block_until_ready()
                if profiler.after(step + 1, metrics):
                    profile = self.trainer.record_profile(profiler.trace, print_with=progress.write)
                    if profile is not None:
                        writer.write(step + 1, {f"profile/{k.replace(' ', '_')}_ms": v
                                                for k, v in profile["split"].items()})
                window.append(metrics)
                window_steps += 1
                done = step + 1
                unchecked.append((done, metrics))
                final = done == self.total_steps
                stop = self._signals.agreed(done, final)
                if not final and stop is None:
                    batch = self.trainer.put(next(batches))
                log_now = done % self.log_every == 0 or final
                eval_now = done % self.eval_every == 0 or final
                save_now = done % self.checkpoint_every == 0 or final or stop is not None
                if log_now or eval_now or save_now:  # nothing of a non-finite step may be logged or saved unseen
                    self._check_finite(unchecked, progress)
                    unchecked = []
                if log_now:
                    values = jax.device_get(window)
                    kept = [m for m in values if m["finite"]]  # all of them unless nonfinite="skip" skipped some
                    mean = {k: float(np.mean([m[k] for m in kept])) if kept else float("nan")
                            for k in ("loss", "accuracy", "grad_norm")}
                    elapsed = time.perf_counter() - window_t
                    last = {"train_loss": mean["loss"], "train_accuracy": mean["accuracy"],
                            "grad_norm": mean["grad_norm"], "learning_rate": float(self.schedule(step)),
                            "epoch": done / self.train_loader.steps_per_epoch,
                            "samples_per_sec": window_steps * self.global_batch_size / elapsed}
                    if self.skip_nonfinite:
                        last["skipped_steps"] = len(values) - len(kept)
                    if self.skip_corrupt:  # found so far by this process (its reads run ahead of the steps)
                        last["skipped_examples"] = len(self.train_loader.source.corrupt)
                    writer.write(done, last)
                    progress.set_postfix(loss=f"{mean['loss']:.4f}", acc=f"{mean['accuracy']:.3f}",
                                         sps=f"{last['samples_per_sec']:.0f}")
                    window, window_t, window_steps = [], time.perf_counter(), 0
                train_time += time.perf_counter() - t
                trained += 1
                progress.update(1)
                if eval_now:
                    t = time.perf_counter()
                    eval_metrics = self.evaluate()
                    writer.write(done, eval_metrics)
                    if self.log_firing_rates:
                        writer.write(done, self.firing_rates())
                    if self.is_main:
                        progress.write(f"step {done}: eval_loss {eval_metrics['eval_loss']:.4f} "
                                       f"eval_accuracy {eval_metrics['eval_accuracy']:.4f}")
                    window_t += time.perf_counter() - t
                if save_now:
                    self._save()
                if stop is None and not final:  # several processes: the stop may be agreed on this step only now
                    stop = self._signals.settle(done)
                    if stop is not None and not save_now:
                        self._check_finite(unchecked, progress)
                        unchecked = []
                        self._save()
                if stop is not None:
                    break
        if stop is not None:
            self._stop(stop, done)
        if not eval_metrics:  # resumed at the end: nothing left to train
            eval_metrics = self.evaluate()
        self._close_checkpoints()

        return {
            "train_loss": last.get("train_loss"), "train_accuracy": last.get("train_accuracy"),
            **eval_metrics, "steps": self.total_steps, "global_batch_size": self.global_batch_size,
            "skipped_steps": self.skipped_steps, "restarts": _restarts(start),
            "skipped_examples": {"train": len(self.train_loader.source.corrupt),
                                 "test": len(self.eval_loader.source.corrupt)},
            "samples_per_sec": trained * self.global_batch_size / train_time if train_time else None,
            "compile_seconds": compile_seconds, "mode": self.plan.mode, "mesh": dict(self.mesh.shape),
            "model": self.model_name, "num_params": self.num_params, "dataset": self.data_name, "dtype": self.dtype,
            "parallel": {"mode": self.plan.mode, "zero_stage": self.plan.zero_stage, "offload": self.offload,
                         "sequence_parallel": self.plan.strategy.sequence_parallel, "reasons": self.plan.reasons,
                         "per_device": {k: v for k, v in step_cost.items() if k != "collectives"},
                         "collectives": step_cost["collectives"]},
        }

    def _log(self, message: str) -> None:
        if self.is_main:
            print(message, flush=True)


def _restarts(start: int) -> list[dict[str, Any]]:
    """The launcher's restarts of this job (attempt, processes, cause, resumed step), this run's start filled in."""
    records = [dict(r) for r in distributed.launch_info().restarts]
    if records and records[-1].get("resumed_step") is None:
        records[-1]["resumed_step"] = start
    return records


def train_and_evaluate(c: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
    """Train ``c`` in ``workdir``; returns the summary (also written to ``workdir/summary.json``)."""
    return Trainer(c, workdir).run()
