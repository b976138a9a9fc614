"""``StepLayout``: how a plan reaches inside a traced step (parameter and gradient layouts, the layout context)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh

from snnjax.parallel import param_stream
from snnjax.parallel.logical import activation_rules
from snnjax.parallel.variables import flat_vars, value


@dataclasses.dataclass(frozen=True, eq=False)
class StepLayout:
    """A plan as the train / eval steps use it (``Plan.step_layout`` builds it).

    ``params`` / ``grads``: sharding trees shaped like the parameters (or None: no constraint; with ``packing``,
    ``params`` is the tree's compute layout and the state holds the packed rows);
    ``rules``: logical name -> mesh axes for activation constraints. ``StepLayout()`` (no mesh) is
    the single-device step: no context, no constraints.
    """

    mesh: Mesh | None = None
    rules: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    params: Any = None
    grads: Any = None
    pipeline: Any = None  # a snnjax.parallel.pipeline.PipelineSpec: gradients through the pipeline over ``stage``
    packing: Any = None  # a snnjax.parallel.stage_params.StagePacking: the parameters are its [S, width] rows
    # The parameters arrive in host memory and each model unit fetches its own (snnjax.parallel.param_stream)
    stream_params: bool = False

    def model_params(self, params):
        """The parameter tree the model merges (unpacked from the pipeline's rows), in its compute layout."""
        return self.constrain_params(self.packing.unpack(params) if self.packing is not None else params)

    def for_forward(self, batch_size: int) -> StepLayout:
        """The layout of a forward-only (eval) step over ``batch_size`` examples. A pipeline's devices all hold the
        whole model once its rows are gathered, so there the batch splits over ``stage`` as well (where it divides;
        otherwise every stage evaluates the batch its data / fsdp shard gives it)."""
        if self.pipeline is None or self.mesh is None:
            return self
        axes = self.rules.get("batch") or ()
        axes = ((axes,) if isinstance(axes, str) else tuple(axes)) + ("stage",)
        if batch_size % math.prod(self.mesh.shape[a] for a in axes):
            return self
        return dataclasses.replace(self, rules={**self.rules, "batch": axes})

    @contextlib.contextmanager
    def context(self):
        """The layout context, entered while the step is traced (see ``snnjax.parallel.logical``)."""
        with contextlib.ExitStack() as stack:
            if self.stream_params:
                stack.enter_context(param_stream.streaming(self._placement_of()))
            if self.mesh is not None:
                stack.enter_context(jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh))
                stack.enter_context(activation_rules(self.mesh, self.rules))
            yield

    def constrain_params(self, params):
        """``params`` in their compute layout (FSDP: all-gathered here; the transpose reduce-scatters). Streamed
        parameters stay in host memory: each unit fetches its own into the compute layout."""
        return params if self.stream_params else _constrain(params, self.params)

    def update_params(self, params):
        """The parameters as the optimizer update reads them: on the device, in their stored layout."""
        return jax.device_put(params, jax.memory.Space.Device) if self.stream_params else params

    def stored_params(self, params):
        """Updated parameters as the step returns them: streamed ones back in host memory."""
        return jax.device_put(params, jax.memory.Space.Host) if self.stream_params else params

    def update_grads(self, grads):
        """Gradients as accumulation and the update read them: streamed ones come back from host memory."""
        if self.stream_params:
            grads = jax.device_put(grads, jax.memory.Space.Device)
        return self.constrain_grads(grads)

    def _placement_of(self):
        compute = {p: value(v) for p, v in flat_vars(self.params)} if self.params is not None else {}
        grads = {p: value(v) for p, v in flat_vars(self.grads)} if self.grads is not None else {}
        return lambda path: param_stream.Placement(compute.get(path), grads.get(path))

    def constrain_grads(self, grads):
        """Gradients in their layout before accumulation and the update (ZeRO-2 / FSDP: reduce-scattered)."""
        return _constrain(grads, self.grads)


def _constrain(tree, shardings):
    return tree if shardings is None else jax.lax.with_sharding_constraint(tree, shardings)
