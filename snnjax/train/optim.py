"""Optimizer and learning-rate schedule from the config."""
from __future__ import annotations

import ml_collections
import optax


def make_schedule(c: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
    """Learning rate per optimizer step: constant, cosine decay, or linear warmup then cosine."""
    if c.schedule == "constant":
        return optax.constant_schedule(c.learning_rate)
    if c.schedule == "cosine":
        return optax.cosine_decay_schedule(c.learning_rate, max(total_steps, 1))
    return optax.warmup_cosine_decay_schedule(0.0, c.learning_rate, c.warmup_steps,
                                              max(total_steps, c.warmup_steps + 1))


def make_optimizer(c: ml_collections.ConfigDict,
                   total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(transformation, schedule)``: optional global-norm clipping, then adam / adamw / sgd."""
    schedule = make_schedule(c, total_steps)
    parts = [optax.clip_by_global_norm(c.grad_clip_norm)] if c.grad_clip_norm > 0 else []
    if c.optimizer == "adamw":
        parts.append(optax.adamw(schedule, weight_decay=c.weight_decay))
    else:
        if c.weight_decay > 0:  # L2 regularisation folded into the gradient
            parts.append(optax.add_decayed_weights(c.weight_decay))
        parts.append(optax.adam(schedule) if c.optimizer == "adam" else optax.sgd(schedule, momentum=c.momentum))
    return optax.chain(*parts), schedule
