"""Optimizer and learning-rate schedule by name (a config's ``optimizer`` / ``schedule`` keys)."""
from __future__ import annotations

import optax


def make_schedule(schedule: str, learning_rate: float, total_steps: int, warmup_steps: int = 0) -> optax.Schedule:
    """Learning rate per optimizer step: ``constant``, ``cosine`` decay, or ``warmup_cosine`` (linear warmup)."""
    if schedule == "constant":
        return optax.constant_schedule(learning_rate)
    if schedule == "cosine":
        return optax.cosine_decay_schedule(learning_rate, max(total_steps, 1))
    if schedule == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps,
                                                  max(total_steps, warmup_steps + 1))
    raise ValueError(f"make_schedule(schedule={schedule!r}): choose constant, cosine or warmup_cosine")


def make_optimizer(optimizer: str, schedule: optax.Schedule, *, weight_decay: float = 0.0, momentum: float = 0.9,
                   grad_clip_norm: float = 0.0) -> optax.GradientTransformation:
    """Optional global-norm clipping (``grad_clip_norm`` > 0), then ``adam`` / ``adamw`` / ``sgd`` at ``schedule``;
    ``weight_decay`` is adamw's decoupled decay, else L2 regularisation folded into the gradient."""
    if optimizer not in ("adam", "adamw", "sgd"):
        raise ValueError(f"make_optimizer(optimizer={optimizer!r}): choose adam, adamw or sgd")
    parts = [optax.clip_by_global_norm(grad_clip_norm)] if grad_clip_norm > 0 else []
    if optimizer == "adamw":
        parts.append(optax.adamw(schedule, weight_decay=weight_decay))
    else:
        if weight_decay > 0:
            parts.append(optax.add_decayed_weights(weight_decay))
        parts.append(optax.adam(schedule) if optimizer == "adam" else optax.sgd(schedule, momentum=momentum))
    return optax.chain(*parts)
