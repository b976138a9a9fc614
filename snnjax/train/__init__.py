"""Training: config schema, pure train/eval steps, checkpoints, metrics and the loop."""
from snnjax.train.config import base_config, validate
from snnjax.train.loop import Trainer, train_and_evaluate
from snnjax.train.step import StepConfig, TrainState, eval_step, train_step

__all__ = ["StepConfig", "TrainState", "Trainer", "base_config", "eval_step", "train_and_evaluate", "train_step",
           "validate"]
