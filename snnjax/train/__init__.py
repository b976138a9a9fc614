"""Training: config schema and loader (``snnjax.train.config.load``), pure train/eval steps, the steps jitted under a
plan, checkpoints, metrics, ``trainer`` / ``ModelTrainer`` / ``load_model``: any model under any layout from Python
(``snnjax.train.model_trainer``), and the loop (``Trainer``: a config's run on a ``ModelTrainer``)."""
from snnjax.train.config import base_config, validate
from snnjax.train.loop import Trainer, train_and_evaluate
from snnjax.train.model_trainer import ModelTrainer, load_model, trainer
from snnjax.train.sharded import apply_plan, eval_fn
from snnjax.train.step import StepConfig, TrainState, eval_step, split_model, train_step

__all__ = ["ModelTrainer", "StepConfig", "TrainState", "Trainer", "apply_plan", "base_config", "eval_fn", "eval_step",
           "load_model", "split_model", "train_and_evaluate", "train_step", "trainer", "validate"]
