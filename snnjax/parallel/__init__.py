"""Parallelism on one mesh with axes data / fsdp / tensor / stage / time.

Modules, in dependency order: ``mesh`` (the device mesh), ``rules`` (strategies as
rule tables over logical axis names), ``logical`` (the names models put on their
parameters and activations, and the layout context), ``layout`` (``StepLayout``:
a plan as a traced step uses it), ``analyze`` (what a model offers to a plan),
``auto`` (``mode="auto"``'s policy), ``describe`` (plans and shardings as text),
``plan`` (a layout for a model on a mesh; ``PipelineOptions`` for ``stage`` > 1), ``param_stream`` (parameters
offloaded to host memory and fetched by each model unit when it runs), ``report`` (a compiled step's per-device
memory and collectives). Jitting a train step under a plan is ``snnjax.train.apply_plan``.
"""
from snnjax.parallel.analyze import analyze
from snnjax.parallel.auto import OBJECTIVES, infer_mode
from snnjax.parallel.describe import describe_shardings, describe_stage_rows, shard_blocks, stage_rows
from snnjax.parallel.layout import StepLayout
from snnjax.parallel.logical import LOGICAL_AXES, annotate, constrain, logical_axes
from snnjax.parallel.mesh import AXES, make_mesh
from snnjax.parallel.pipeline_plan import PipelineOptions
from snnjax.parallel.plan import Plan, plan
from snnjax.parallel.report import collective_stats, format_report, memory_stats, step_report
from snnjax.parallel.rules import MODES, STRATEGIES, Strategy, get_strategy
from snnjax.parallel.temporal import neuron_schedules

__all__ = ["AXES", "LOGICAL_AXES", "MODES", "OBJECTIVES", "PipelineOptions", "Plan", "STRATEGIES", "StepLayout",
           "Strategy", "analyze", "annotate", "collective_stats", "constrain", "describe_shardings",
           "describe_stage_rows", "format_report", "get_strategy", "infer_mode", "logical_axes", "make_mesh",
           "memory_stats", "neuron_schedules", "plan", "shard_blocks", "stage_rows", "step_report"]
