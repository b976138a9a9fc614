"""``train_and_evaluate(config, workdir)``: the training program behind ``train.py``.

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
* A checkpoint that cannot be written: :class:`CheckpointError` naming the step
  and the complete checkpoints left, which the failure did not touch.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from snnjax import monitor, parallel
from snnjax.data import Loader, get_source
from snnjax.models import create_model, remat
from snnjax.models.registry import REGISTRY, DataShape, sizes_from_data
from snnjax.parallel import mesh as mesh_lib
from snnjax.parallel import pipeline_plan
from snnjax.parallel import rules as rules_lib
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.runtime import distributed
from snnjax.train import config as config_lib
from snnjax.train import faults, memory_search, pipeline_memory
from snnjax.train import offload as offload_lib
from snnjax.train.checkpoint import Checkpointer, CheckpointError, complete_steps
from snnjax.train.faults import NonFiniteError, Preempted
from snnjax.train.metrics import MetricWriter
from snnjax.train.optim import make_optimizer
from snnjax.train.sharded import apply_plan, eval_fn
from snnjax.train.step import StepConfig, TrainState, model_inputs, split_model

__all__ = ["NonFiniteError", "Preempted", "Trainer", "train_and_evaluate"]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}  # config.dtype -> compute dtype
_OFFLOADED = {"opt_state": "optimizer state", "params": "parameters (fetched per unit)",
              "all": "parameters (fetched per unit) and optimizer state"}


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
                      compute_dtype=DTYPES[c.dtype], skip_nonfinite=c.nonfinite == "skip")


def _pipeline_args(c: ml_collections.ConfigDict, source, dtype) -> dict[str, Any]:
    """``plan``'s pipeline keywords for mode ``pp`` (and ``auto``, which may choose it unless the batch is
    accumulated): the options, and the batch shape the stage split is costed on."""
    if c.parallel.mode != "pp" and not (c.parallel.mode == "auto" and c.grad_accum_steps == 1):
        return {}
    data = DataShape.of(source, c.data.time_steps)
    return {"pipeline": PipelineOptions(**c.parallel.pp), "compute_dtype": dtype,
            "input_shape": (data.time_steps, c.global_batch_size, *data.frame_shape)}


def make_mesh(c: ml_collections.ConfigDict):
    """The config's mesh (one device for ``none``; None for ``auto``, whose plan picks it), checked against the mode."""
    if c.parallel.mode == "auto":
        return None
    if c.parallel.mode == "none":
        return mesh_lib.make_mesh("data=1", jax.devices()[:1])
    mesh = mesh_lib.make_mesh(c.parallel.mesh)
    if c.parallel.mode == "pp":  # the plan checks the stage axis and the mode the other axes imply
        return mesh
    strategy = rules_lib.get_strategy(c.parallel.mode, _zero_stage(c), c.parallel.sequence_parallel)
    rules_lib.check_mesh(strategy, dict(mesh.shape))
    return mesh


def _zero_stage(c: ml_collections.ConfigDict) -> int | None:
    return None if c.parallel.zero_stage == -1 else c.parallel.zero_stage


def _global_batch(mesh, batch: dict[str, np.ndarray], time_major: bool) -> dict[str, jax.Array]:
    def put(name, x):
        axis = 1 if (name == "inputs" and time_major) else 0
        return jax.make_array_from_process_local_data(mesh_lib.batch_sharding(mesh, x.ndim, axis), x)

    return {k: put(k, v) for k, v in batch.items()}


class Trainer:
    """Holds what one run needs; ``run()`` trains, evaluates, checkpoints and writes the summary."""

    def __init__(self, c: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, model: nnx.Module | None = None):
        """``model``: train this ``nnx.Module`` (inputs ``[T, N, ...]``, logits ``[T, N, classes]``) instead of
        ``config.model`` (whose keys are then ignored); ``model()`` hands it back trained."""
        config_lib.validate(c)
        self.c = c
        self.workdir = pathlib.Path(workdir)
        self.is_main = jax.process_index() == 0
        self.mesh = make_mesh(c)
        if self.mesh is not None:
            mesh_lib.check_batch_divides(self.mesh, c.global_batch_size, c.grad_accum_steps)

        train_src, test_src = make_sources(c)
        self.time_major = train_src.time_steps is not None
        # Each process reads the rows its devices hold. Mode auto (mesh planned below) splits the batch outermost
        # over a multiple of the process count, where the default slice (process k of P) is those rows.
        rows = None if self.mesh is None else mesh_lib.batch_sharding(self.mesh, 1)
        self.train_loader = Loader(train_src, c.global_batch_size, seed=c.seed, shuffle=True,
                                   drop_remainder=True, prefetch=c.data.prefetch, batch_sharding=rows)
        self.eval_loader = Loader(test_src, c.global_batch_size, seed=c.seed, shuffle=False,
                                  drop_remainder=False, prefetch=c.data.prefetch, batch_sharding=rows)
        spe = self.train_loader.steps_per_epoch
        self.total_steps = c.num_steps if c.num_steps > 0 else c.num_epochs * spe
        self.eval_every = c.eval_every_steps if c.eval_every_steps > 0 else spe

        dtype = DTYPES[c.dtype]
        self.model_name = c.model.name if model is None else type(model).__name__
        if model is None:
            model = init_model(c, train_src)
        settings = config_lib.remat_settings(c)
        if callable(getattr(model, "units", None)) or settings != remat.MemorySettings():
            remat.configure(model, settings)
        self.tx, self.schedule = make_optimizer(c, self.total_steps)
        self._plan_for = functools.cache(functools.partial(self._make_plan, model, train_src, dtype))
        self.plan = self._plan_for(None)
        self.mesh = self.plan.mesh
        self.memory_search = None

        self.step_cfg = step_cfg = step_config(c, self.time_major)
        self.offload = c.parallel.offload if c.parallel.offload != "auto" else "none"
        if c.parallel.memory_budget_mb > 0:
            self.memory_search = self._search_memory(model, step_cfg, train_src, dtype)
            chosen = self.memory_search.chosen.candidate
            self.offload = chosen.offload
            if self.plan.mode == "pp":
                self.plan = self._plan_for(chosen.microbatches)
        self.plan = self.plan.with_offload(self.offload)
        if self.offload != "none" and not offload_lib.saves_device_memory(self.plan.mesh.devices.flat[0].platform):
            what = {"opt_state": "the optimizer state moves", "params": "the parameters move",
                    "all": "the parameters and the optimizer state move"}[self.offload]
            self._log(f"note: parallel.offload={self.offload}: on this backend host memory is the device's own memory, "
                      f"so {what} between memory kinds each step and no memory is saved")
        graphdef, params, rngs, rest = split_model(model)
        self._graphdef = graphdef
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                           opt_state=self.tx.init(params))
        self.num_params = sum(x.size for x in jax.tree.leaves(params))
        self.state, self._train_step = apply_plan(self.plan, state, step_cfg, graphdef, self.tx, offload=self.offload)
        params_like = self.state.params if self.plan.packing is None else self.plan.packing.abstract_tree()
        self._eval_step = eval_fn(self.plan, self.state.replace(params=params_like), step_cfg, graphdef)
        self.checkpointer = None
        self.skipped_steps = 0  # steps whose update was skipped (nonfinite="skip"), over the whole run
        self._signals = faults.StopSignals()  # SIGTERM / SIGINT handlers while run() trains

    def model(self) -> nnx.Module:
        """The model as trained so far (a new ``nnx.Module``; arrays placed as the plan stores them)."""
        state = self._as_tree(self.state)
        return nnx.merge(self._graphdef, state.params, state.rngs, state.model_state)

    def _make_plan(self, model: nnx.Module, source, dtype, microbatches: int | None) -> parallel.Plan:
        """The run's parallel plan; with ``microbatches``, the pipeline on the first plan's mesh with that many
        microbatches instead of ``parallel.pp.microbatches`` (mode auto is not chosen again)."""
        c = self.c
        pipeline = _pipeline_args(c, source, dtype)
        if c.parallel.time_blocks and "input_shape" not in pipeline:  # checks the block count against each layer
            data = DataShape.of(source, c.data.time_steps)
            pipeline.update(input_shape=(data.time_steps, c.global_batch_size, *data.frame_shape), compute_dtype=dtype)
        if microbatches is not None:
            pipeline["pipeline"] = dataclasses.replace(pipeline["pipeline"], microbatches=microbatches)
        return parallel.plan(model, self.mesh if self.mesh is not None else jax.device_count(),
                             mode=c.parallel.mode if microbatches is None else "pp", objective=c.parallel.objective,
                             zero_stage=_zero_stage(c),
                             sequence_parallel=c.parallel.sequence_parallel,
                             global_batch_size=c.global_batch_size // c.grad_accum_steps,
                             opt_slots=1 if c.optimizer == "sgd" else 2, min_shard_size=c.parallel.min_shard_size,
                             memory_budget_bytes=int(c.parallel.memory_budget_mb * 2**20) or None,
                             time_steps=c.data.time_steps, time_blocks=c.parallel.time_blocks, **pipeline)

    def _search_memory(self, model: nnx.Module, step_cfg: StepConfig, source, dtype):
        """Configure ``model`` with the fastest checkpointing plan whose compiled peak per device fits
        ``parallel.memory_budget_mb`` (``snnjax.train.memory_search``), for each device's share of a microbatch;
        under mode pp, with the microbatch count (``snnjax.train.pipeline_memory``), for the whole step."""
        c = self.c
        shards = self.plan.axis_sizes.get("data", 1) * self.plan.axis_sizes.get("fsdp", 1)
        pp = self.plan.mode == "pp"
        rows = c.global_batch_size // c.grad_accum_steps // (1 if pp else shards)
        data = DataShape.of(source, c.data.time_steps)
        lead = (data.time_steps, rows) if self.time_major else (rows,)
        batch = {"inputs": jax.ShapeDtypeStruct((*lead, *data.frame_shape), jnp.float32),
                 "labels": jax.ShapeDtypeStruct((rows,), jnp.int32)}
        offloads = (c.parallel.offload,) if c.parallel.offload != "auto" else ("none", "opt_state")
        if c.parallel.offload == "auto" and not offload_lib.saves_device_memory():
            offloads = ("none",)
            self._log("note: parallel.offload=auto: host memory is the device's own memory on this backend, so the "
                      "memory search does not offload")
        budget = int(c.parallel.memory_budget_mb * 2**20)
        if pp:
            result = self._search_pipeline_memory(model, step_cfg, batch, offloads, budget)
        else:
            inputs = None if self.time_major else jax.ShapeDtypeStruct((c.data.time_steps, rows, *data.frame_shape),
                                                                       dtype)
            result = memory_search.search_model(model, dataclasses.replace(step_cfg, grad_accum_steps=1), self.tx,
                                                batch, budget, inputs=inputs, offloads=offloads)
        self._log(result.summary() + (f" (per device: {rows} of the {c.global_batch_size} examples per step)"
                                      if not pp and (shards > 1 or c.grad_accum_steps > 1) else ""))
        if result.chosen is None:
            fixes = ("raise parallel.pp.microbatches (smaller microbatches), lower global_batch_size, set "
                     "parallel.zero_stage=1 or 2 (optimizer state and gradients split over data within a stage), "
                     "or pipeline over more stages" if pp else
                     "lower global_batch_size or raise grad_accum_steps, or shard over more devices")
            raise ValueError(f"no checkpointing plan fits parallel.memory_budget_mb={c.parallel.memory_budget_mb:g} "
                             f"(the smallest compiled peak is {min(m.peak_bytes for m in result.tried) / 2**20:,.1f} "
                             f"MiB per device): raise the budget, {fixes}")
        remat.configure(model, result.chosen.candidate.settings)
        return result

    def _search_pipeline_memory(self, model, step_cfg, batch, offloads, budget) -> memory_search.SearchResult:
        pp, sizes = self.c.parallel.pp, self.plan.axis_sizes
        if pp.microbatches > 0:
            times = [(pp.microbatches, 0.0)]
        else:
            times = pipeline_plan.microbatch_options(batch["labels"].shape[0], sizes["data"] * sizes["fsdp"],
                                                     sizes["stage"], pp.virtual_stages, pp.schedule)
        axis = {"inputs": 1 if self.time_major else 0, "labels": 0}
        compile_for = pipeline_memory.step_compiler(
            model, step_cfg, self.tx, batch, self._plan_for,
            lambda plan: {k: plan.batch_sharding(v.ndim, axis[k]) for k, v in batch.items()})
        return pipeline_memory.search([c for o in offloads for c in pipeline_memory.candidates(times, o)],
                                      compile_for, budget)

    # -- checkpoints -------------------------------------------------------------------------

    def _open_checkpoints(self) -> None:
        ckpt_dir = self.workdir / "checkpoints"
        existing = bool(complete_steps(ckpt_dir))  # a failed first save leaves only a tmp folder: start afresh
        # A job the launcher restarted (or SLURM requeued) continues from its latest complete checkpoint.
        if self.c.resume or (existing and distributed.launch_info().restarted):
            if not existing:
                raise CheckpointError(f"resume=True but {ckpt_dir} holds no checkpoint; run without "
                                      "--config.resume=True to start fresh, or pass the run's --workdir")
            reader = Checkpointer(ckpt_dir, self.c.keep_checkpoints, read_only=True)
            tree_state, meta = reader.restore(self._as_tree(self.state))
            self.state = self._as_stored(tree_state)
            reader.close()
            self.skipped_steps = int(meta.get("skipped_steps", 0))
            if meta.get("global_batch_size") != self.c.global_batch_size or meta.get("data") != self.c.data.name:
                raise CheckpointError(f"the checkpoint in {ckpt_dir} was written with global_batch_size="
                                      f"{meta.get('global_batch_size')} on {meta.get('data')!r}; this run uses "
                                      f"{self.c.global_batch_size} on {self.c.data.name!r}, so it cannot continue "
                                      "the same trajectory")
        elif existing:
            raise CheckpointError(f"{ckpt_dir} already holds checkpoints; pass --config.resume=True to continue that "
                                  "run, or choose another --workdir (nothing was overwritten). From Python: set "
                                  "config.resume = True, or pass another workdir to Trainer(config, workdir)")
        self.checkpointer = Checkpointer(ckpt_dir, self.c.keep_checkpoints)

    def _as_tree(self, state):
        """``state`` with the model's parameter tree: checkpoints hold that, so they restore into any layout (the
        pipeline stores each device's parameters packed, ``snnjax.parallel.stage_params``)."""
        return state if self.plan.packing is None else self._unpack_state(state)

    @functools.cached_property
    def _unpack_state(self):  # jitted once: every checkpoint save calls it
        return jax.jit(self.plan.packing.unpack_state)

    def _as_stored(self, tree_state):
        """Inverse of ``_as_tree``: the layout's own form, placed as ``self.state`` is."""
        packing = self.plan.packing
        if packing is None:
            return tree_state
        return jax.jit(packing.pack_state, out_shardings=jax.tree.map(lambda x: x.sharding, self.state))(tree_state)

    def _save(self) -> None:
        meta = {"global_batch_size": self.c.global_batch_size, "data": self.c.data.name,
                "skipped_steps": self.skipped_steps, "config": json.loads(self.c.to_json_best_effort())}
        self.checkpointer.save(self._as_tree(self.state), meta)

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
                   "with --config.resume=True")
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
                    f"{faults.inputs_note(self.train_loader, self.c.data.name, done)}")
            if self.c.nonfinite == "skip":
                self.skipped_steps += 1
                if self.is_main:
                    progress.write(f"{what} Its update was skipped (config.nonfinite='skip').")
                continue
            self.checkpointer.wait()
            raise faults.NonFiniteError(
                f"{what} Training stopped (config.nonfinite='stop'); nothing from step {done} on was saved, and "
                f"{self._kept()}, all from before it. Fix the data (or lower config.learning_rate / set "
                "config.grad_clip_norm) and rerun the same command with --config.resume=True, or add "
                "--config.nonfinite=skip to skip such steps.")

    # -- evaluation --------------------------------------------------------------------------

    def _eval_state(self) -> TrainState:
        """What the eval step reads: under a pipeline, the parameter tree gathered from the stage rows once per
        evaluation rather than in every eval step (and no optimizer state)."""
        if self.plan.packing is None:
            return self.state
        return self.state.replace(params=self._gather_params(self.state.params), opt_state=())

    @functools.cached_property
    def _gather_params(self):
        packing = self.plan.packing
        return jax.jit(packing.unpack, out_shardings=self.plan.param_shardings(packing.abstract_tree(), "compute"))

    def firing_rates(self) -> dict[str, float]:
        """``firing_rate/<neuron path>``: each spiking neuron's spikes per neuron per step on the first eval batch
        (eval mode; ``snnjax.monitor``)."""
        batch = _global_batch(self.mesh, next(iter(self.eval_loader.epoch_batches(0))), self.time_major)
        inputs = jax.jit(functools.partial(model_inputs, self.step_cfg))(batch["inputs"], jax.random.key(self.c.seed))
        return {f"firing_rate/{k}": v for k, v in monitor.firing_rates(self.model(), inputs).items()}

    def evaluate(self) -> dict[str, float]:
        totals = {"loss": 0.0, "correct": 0.0, "count": 0.0}
        state = self._eval_state()
        for i, batch in enumerate(self.eval_loader.epoch_batches(0)):
            out = self._eval_step(state, _global_batch(self.mesh, batch, self.time_major), jnp.asarray(i))
            for k, v in jax.device_get(out).items():
                totals[k] += float(v)
        n = max(totals["count"], 1.0)
        return {"eval_loss": totals["loss"] / n, "eval_accuracy": totals["correct"] / n}

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
        writer = MetricWriter(self.workdir, enabled=self.is_main)
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
        c = self.c
        start = int(jax.device_get(self.state.step))
        if self.is_main:
            (self.workdir / "config.json").write_text(c.to_json_best_effort(indent=2))

        batches = self.train_loader.batches(start_step=start)
        first = _global_batch(self.mesh, next(batches), self.time_major)
        t0 = time.perf_counter()
        compiled = self._train_step.lower(self.state, first).compile()
        compile_seconds = time.perf_counter() - t0
        mesh_desc = " x ".join(f"{k}={v}" for k, v in self.mesh.shape.items() if v > 1) or "1 device"
        self._log(f"{self.model_name}: {self.num_params:,} parameters; mode {self.plan.mode} on {mesh_desc}; "
                  f"{self.total_steps} steps of {c.global_batch_size} ({self.train_loader.steps_per_epoch}/epoch); "
                  f"compiled in {compile_seconds:.1f}s" + (f"; offloaded to host memory: {_OFFLOADED[self.offload]}"
                                                          if self.offload != "none" else "")
                  + (f"; resuming at step {start}" if start else ""))
        step_cost = parallel.step_report(compiled, self.state)
        if c.parallel.print_summary:
            self._log(str(self.plan))
            self._log(parallel.format_report(step_cost, f"per-device cost of one train step ({self.plan.mode}, "
                                             f"{mesh_desc})"))

        progress = tqdm(total=self.total_steps, initial=start, disable=not self.is_main, unit="step",
                        dynamic_ncols=True)
        window, window_t, window_steps = [], time.perf_counter(), 0
        train_time, trained, last = 0.0, 0, {}
        eval_metrics: dict[str, float] = {}
        unchecked: list[tuple[int, dict[str, jax.Array]]] = []  # (step, metrics) whose finite flag is unread
        batch, stop = first, None
        with progress:
            for step in range(start, self.total_steps):
                t = time.perf_counter()
                self.state, metrics = compiled(self.state, batch)
                window.append(metrics)
                window_steps += 1
                done = step + 1
                unchecked.append((done, metrics))
                final = done == self.total_steps
                stop = self._signals.agreed(done, final)
                if not final and stop is None:
                    batch = _global_batch(self.mesh, next(batches), self.time_major)
                log_now = done % c.log_every_steps == 0 or final
                eval_now = done % self.eval_every == 0 or final
                save_now = done % c.checkpoint_every_steps == 0 or final or stop is not None
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
                            "samples_per_sec": window_steps * c.global_batch_size / elapsed}
                    if c.nonfinite == "skip":
                        last["skipped_steps"] = len(values) - len(kept)
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
                    if c.monitor.firing_rates:
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
            **eval_metrics, "steps": self.total_steps, "global_batch_size": c.global_batch_size,
            "skipped_steps": self.skipped_steps, "restarts": _restarts(start),
            "samples_per_sec": trained * c.global_batch_size / train_time if train_time else None,
            "compile_seconds": compile_seconds, "mode": self.plan.mode, "mesh": dict(self.mesh.shape),
            "model": self.model_name, "num_params": self.num_params, "dataset": c.data.name, "dtype": c.dtype,
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
