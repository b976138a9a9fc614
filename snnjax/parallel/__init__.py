"""Parallelism on one mesh with axes data / fsdp / tensor / stage.

Strategies are rule tables (``rules``) over logical axis names that the models
attach to their parameters (``logical``); ``plan`` / ``apply`` turn a model and a
mesh into sharded train state and a jitted step; ``report`` reads a compiled
step's per-device memory and collectives.
"""
from snnjax.parallel.logical import LOGICAL_AXES, annotate, constrain, logical_axes
from snnjax.parallel.mesh import AXES, make_mesh
from snnjax.parallel.plan import Plan, analyze, apply, describe_shardings, eval_fn, infer_mode, plan, step_layout
from snnjax.parallel.report import collective_stats, format_report, memory_stats, step_report
from snnjax.parallel.rules import MODES, STRATEGIES, Strategy, get_strategy

__all__ = ["AXES", "LOGICAL_AXES", "MODES", "Plan", "STRATEGIES", "Strategy", "analyze", "annotate", "apply",
           "collective_stats", "constrain", "describe_shardings", "eval_fn", "format_report", "get_strategy",
           "infer_mode", "logical_axes", "make_mesh", "memory_stats", "plan", "step_layout", "step_report"]
