"""Pure train and eval steps: ``(state, batch) -> (state, metrics)``.

The model is carried as NNX state split into parameters, RNG streams and the
rest (BatchNorm statistics, ...). Randomness is a pure function of
``(seed, step)``: the dropout stream is reseeded from it on every step, so a
resumed run replays exactly the same masks and Poisson spikes.

Parallel layouts enter through an optional ``snnjax.parallel.StepLayout``: the
parameters are constrained to their compute layout before the forward (FSDP:
all-gathered), each gradient to its layout before accumulation and the update
(ZeRO-2 / FSDP: reduce-scattered), and the layout context (activation rules and
the mesh, ``snnjax.parallel.logical``) is entered while the step is traced. With
parameters offloaded (``StepLayout.stream_params``) they arrive in host memory, each
model unit fetches its own when it runs (``snnjax.parallel.param_stream``), their
gradients come back from host memory for the update, and the new parameters go there.

Every step reports ``metrics["finite"]``: whether its loss and gradient norm
are finite (a NaN/inf anywhere in the gradients makes the norm non-finite).
With ``skip_nonfinite`` a step that is not finite applies no update: it returns
the parameters, optimizer state and model state (BatchNorm statistics) it was
given, with the step counter advanced, so the data and randomness of later
steps stay those of their step number.

With a pipeline in the layout (``parallel.mode=pp``), the gradients of the pipeline's microbatches
come from ``snnjax.parallel.pipeline`` and the update is the same.

With ``method="ottt"`` or ``"sltt"`` the gradients come from ``snnjax.train.online`` (one time step at a time, a
``lax.scan`` over ``T`` whose memory does not grow with ``T``; with ``online_updates`` the optimizer has already
applied each step's gradient there) and the rest of the step is the same.

With ``grad_accum_steps == 1`` the step has no loop: XLA:CPU runs a convolution's
gradient many times slower inside a loop body than outside (jax-ml/jax issue
12868), and a one-iteration scan would be that loop.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from snnjax.data.encoders import encode
from snnjax.parallel.layout import StepLayout
from snnjax.parallel.logical import constrain
from snnjax.parallel.pipeline import pipeline_gradients
from snnjax.parallel.variables import fresh
from snnjax.train import online


@struct.dataclass
class TrainState:
    """Everything a training step reads and writes (a pytree)."""

    step: jax.Array  # int32 scalar: optimizer steps taken
    params: nnx.State  # nnx.Param variables
    rngs: nnx.State  # nnx.RngState (reseeded every step; not checkpointed)
    model_state: nnx.State  # everything else (BatchNorm statistics, neuron state, ...)
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static settings of the step functions (hashable)."""

    seed: int
    time_steps: int
    encoder: str | None  # None: inputs are already [T, N, ...]
    loss: str = "ce"
    tet_lambda: float = 0.0
    grad_accum_steps: int = 1
    compute_dtype: Any = jnp.float32
    return_grads: bool = False  # also return the (averaged) gradients as metrics["grads"] (tests, debugging)
    skip_nonfinite: bool = False  # a step with a non-finite loss or gradient norm keeps the state it was given
    method: str = "bptt"  # bptt, or online through time one step at a time: ottt, sltt (snnjax.train.online)
    online_updates: bool = False  # ottt / sltt: the optimizer applies every time step's gradient (T updates a batch)


def split_model(model: nnx.Module):
    """``(graphdef, params, rngs, rest)``."""
    return nnx.split(model, nnx.Param, nnx.RngState, ...)


def classification_loss(logits: jax.Array, labels: jax.Array, kind: str = "ce", tet_lambda: float = 0.0):
    """Per-example loss of logits ``[T, N, K]``.

    ``ce``: cross-entropy of the time-mean logits (SpikingJelly's usual objective).
    ``tet``: mean over t of the cross-entropy of each step's logits, plus
    ``tet_lambda`` times the mean squared distance of the logits to 1 (Deng et al., 2022).
    ``mse``: mean over classes of the squared distance of the time-mean output (a firing rate, e.g. a
    voting layer's) to the one-hot label (SpikingJelly's DVS Gesture recipe, ``F.mse_loss(out_fr, one_hot)``).
    """
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    if kind == "ce":
        return optax.softmax_cross_entropy_with_integer_labels(logits.mean(0), labels)
    if kind == "mse":
        one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
        return jnp.mean(jnp.square(logits.mean(0) - one_hot), axis=-1)
    per_step = optax.softmax_cross_entropy_with_integer_labels(logits, labels[None])  # [T, N]
    loss = per_step.mean(0)
    if tet_lambda:
        loss = (1.0 - tet_lambda) * loss + tet_lambda * jnp.mean(jnp.square(logits - 1.0), axis=(0, 2))
    return loss


def loss_and_accuracy(cfg: StepConfig, logits: jax.Array, labels: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """The batch-mean loss of ``logits [T, N, K]`` and the accuracy of their time mean, in ``dtype``."""
    loss = classification_loss(logits, labels, cfg.loss, cfg.tet_lambda).mean().astype(dtype)
    return loss, jnp.mean(jnp.argmax(logits.mean(0), -1) == labels).astype(dtype)


def model_inputs(cfg: StepConfig, inputs: jax.Array, key: jax.Array) -> jax.Array:
    """Batch inputs -> the model's ``[T, N, ...]`` in the compute dtype."""
    if cfg.encoder is not None:
        inputs = encode(cfg.encoder, inputs, cfg.time_steps, key)
    return inputs.astype(cfg.compute_dtype)


def _microbatches(x: jax.Array, labels: jax.Array, k: int):
    """Split the batch axis (1 of ``x [T, N, ...]``, 0 of labels) into ``k`` leading chunks, each split like the
    batch."""
    t, n = x.shape[:2]
    xs = x.reshape(t, k, n // k, *x.shape[2:]).swapaxes(0, 1)
    xs = constrain(xs, (None, "time", "batch") + (None,) * (xs.ndim - 3))
    return xs, constrain(labels.reshape(k, n // k), (None, "batch"))


def train_step(cfg: StepConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               state: TrainState, batch: dict[str, jax.Array], *,
               layout: StepLayout = StepLayout()) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on ``batch`` (``inputs``, ``labels``); gradients averaged over microbatches."""
    with layout.context():
        return _train_step(cfg, graphdef, tx, state, batch, layout)


def _train_step(cfg, graphdef, tx, state, batch, layout):
    key = jax.random.fold_in(jax.random.key(cfg.seed), state.step)
    enc_key, drop_key = jax.random.split(key)
    x = model_inputs(cfg, batch["inputs"], enc_key)
    acc_dtype = jnp.promote_types(cfg.compute_dtype, jnp.float32)  # loss/accuracy sums

    def loss_fn(params, model_state, x, y, i):
        params = layout.constrain_params(params)
        model = nnx.merge(graphdef, params, fresh(state.rngs), fresh(model_state))
        nnx.reseed(model, dropout=jax.random.fold_in(drop_key, i))
        loss, correct = loss_and_accuracy(cfg, model(x), y, acc_dtype)
        return loss, (correct, split_model(model)[3])

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    k = cfg.grad_accum_steps
    online_params = None
    if cfg.method != "bptt":
        grads, online_params, online_opt, model_state, loss_sum, acc_sum = online.online_gradients(
            cfg, graphdef, tx, state, x, batch["labels"], drop_key, layout, acc_dtype,
            lambda logits, y: loss_and_accuracy(cfg, logits, y, acc_dtype))
    elif layout.pipeline is not None:
        k = layout.pipeline.microbatches
        grads, model_state, loss_sum, acc_sum = _pipeline_gradients(cfg, graphdef, state, x, batch["labels"], k,
                                                                    drop_key, layout, acc_dtype)
    elif k == 1:
        x = constrain(x, ("time", "batch") + (None,) * (x.ndim - 2))
        y = constrain(batch["labels"], ("batch",))
        (loss_sum, (acc_sum, model_state)), grads = grad_fn(state.params, state.model_state, x, y,
                                                            jnp.zeros((), jnp.int32))
        grads = layout.update_grads(grads)
    else:
        xs, ys = _microbatches(x, batch["labels"], k)

        def accumulate(carry, inp):
            grads, model_state, loss_sum, acc_sum = carry
            i, x, y = inp
            (loss, (acc, model_state)), g = grad_fn(state.params, model_state, x, y, i)
            grads = jax.tree.map(jnp.add, grads, layout.update_grads(g))
            return (grads, model_state, loss_sum + loss, acc_sum + acc), None

        zeros = layout.constrain_grads(jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype), state.params))
        init = (zeros, state.model_state, jnp.zeros((), acc_dtype), jnp.zeros((), acc_dtype))
        (grads, model_state, loss_sum, acc_sum), _ = jax.lax.scan(accumulate, init, (jnp.arange(k), xs, ys))
        grads = layout.constrain_grads(jax.tree.map(lambda g: g / k, grads))
    old_params = layout.update_params(state.params)  # on the device (streamed parameters come from host memory)
    if cfg.online_updates and online_params is not None:  # applied at every time step already
        params, opt_state = layout.update_params(online_params), online_opt
    else:
        updates, opt_state = tx.update(grads, state.opt_state, old_params)
        params = optax.apply_updates(old_params, updates)
    loss, grad_norm = loss_sum / k, optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if cfg.skip_nonfinite:
        params, opt_state, model_state = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old), (params, opt_state, model_state),
            (old_params, state.opt_state, state.model_state))
    params = layout.stored_params(params)
    new_state = state.replace(step=state.step + 1, params=params, model_state=model_state, opt_state=opt_state)
    metrics = {"loss": loss, "accuracy": acc_sum / k, "grad_norm": grad_norm, "finite": finite}
    if cfg.return_grads:
        metrics["grads"] = grads
    return new_state, metrics


def _pipeline_gradients(cfg, graphdef, state, x, labels, k, drop_key, layout, acc_dtype):
    """Summed gradients of the ``k`` microbatches through ``layout.pipeline`` (``snnjax.parallel.pipeline``)."""
    xs, ys = _microbatches(x, labels, k)
    params = layout.constrain_params(state.params) if layout.packing is None else state.params
    grads, model_state, loss_sum, acc_sum = pipeline_gradients(
        layout.pipeline, layout.mesh, graphdef, params, state.rngs, state.model_state, xs, ys, drop_key,
        loss_fn=lambda logits, y: loss_and_accuracy(cfg, logits, y, acc_dtype), acc_dtype=acc_dtype,
        packing=layout.packing, grad_axes=_row_axes(layout.grads) if layout.packing is not None else ())
    grads = layout.constrain_grads(jax.tree.map(lambda g: g / k, grads))
    return grads, model_state, loss_sum, acc_sum


def _row_axes(sharding) -> tuple[str, ...]:
    """The mesh axes within a stage that split a packed gradient row (its spec's second entry)."""
    if sharding is None or len(sharding.spec) < 2 or sharding.spec[1] is None:
        return ()
    axes = sharding.spec[1]
    return (axes,) if isinstance(axes, str) else tuple(axes)


def eval_step(cfg: StepConfig, graphdef: nnx.GraphDef, state: TrainState, batch: dict[str, jax.Array],
              index: jax.Array, *, layout: StepLayout = StepLayout()) -> dict[str, jax.Array]:
    """Sums over the unmasked examples of ``batch``: ``loss``, ``correct``, ``count`` (eval mode: running BN stats)."""
    layout = layout.for_forward(batch["labels"].shape[0])
    with layout.context():
        return _eval_step(cfg, graphdef, state, batch, index, layout)


def _eval_step(cfg, graphdef, state, batch, index, layout):
    key = jax.random.fold_in(jax.random.key(cfg.seed + 1), index)
    model = nnx.merge(graphdef, layout.model_params(state.params), state.rngs, state.model_state)
    model.eval()
    x = model_inputs(cfg, batch["inputs"], key)
    logits = model(constrain(x, ("time", "batch") + (None,) * (x.ndim - 2)))
    mask = batch["mask"].astype(jnp.float32)
    loss = classification_loss(logits, batch["labels"], cfg.loss, cfg.tet_lambda)
    correct = (jnp.argmax(logits.mean(0), -1) == batch["labels"]).astype(jnp.float32)
    return {"loss": jnp.sum(loss * mask), "correct": jnp.sum(correct * mask), "count": jnp.sum(mask)}
