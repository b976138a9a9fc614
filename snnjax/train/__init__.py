"""Training: config schema, pure train/eval steps, the steps jitted under a plan, checkpoints, metrics, the loop."""
from snnjax.train.config import base_config, validate
from snnjax.train.loop import Trainer, train_and_evaluate
from snnjax.train.sharded import apply_plan, eval_fn
from snnjax.train.step import StepConfig, TrainState, eval_step, train_step

__all__ = ["StepConfig", "TrainState", "Trainer", "apply_plan", "base_config", "eval_fn", "eval_step",
           "train_and_evaluate", "train_step", "validate"]
