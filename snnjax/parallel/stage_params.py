"""Pipeline parameters stored per device: each device on ``stage`` holds only the parameters its stages use.

Under ``mode=pp`` the parameters (and every optimizer array shaped like them) are one ``[S, width]`` array
sharded over ``stage``: row ``d`` holds, raveled one after another and zero-padded to ``width``, the
parameters of the (virtual) stages device ``d`` runs (stages ``d, d + S, ...``). A device thus stores
about 1/S of the parameters, gradients and optimizer state instead of all of them, and the pipeline
reads its stages' parameters from its own row, with no communication over ``stage``.

``unpack`` gives back the model's parameter tree (the eval step, checkpoints: a checkpoint holds the
tree, so it restores into any layout); ``pack_state`` / ``unpack_state`` convert a whole ``TrainState``,
optimizer state included (its parameter-shaped parts: Adam's moments).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from snnjax.parallel.variables import owner, path_str


def leaf_stages(params, owns: Sequence[Sequence[str]], layout: Sequence[int]) -> list[int]:
    """The (virtual) stage of each parameter leaf (``jax.tree.leaves`` order): the stage of the unit that owns it
    (``owns``: each unit's module paths; ``layout``: units per stage)."""
    unit_stage = np.repeat(np.arange(len(layout)), layout)
    return [int(unit_stage[owner(owns, path_str(p))]) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


@dataclasses.dataclass(frozen=True, eq=False)
class StagePacking:
    """Where each parameter leaf (in ``jax.tree.leaves`` order) lives: its device's row and its offset there."""

    stages: int
    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtype: Any
    device: tuple[int, ...]
    offset: tuple[int, ...]
    width: int

    @classmethod
    def build(cls, params, leaf_device: Sequence[int], stages: int, multiple: int = 1) -> StagePacking:
        """The packing of ``params`` (arrays or ``jax.ShapeDtypeStruct``) with leaf ``i`` on device
        ``leaf_device[i]``; rows padded to a multiple of ``multiple`` (for sharding them further)."""
        leaves, treedef = jax.tree.flatten(params)
        dtypes = {jnp.dtype(leaf.dtype) for leaf in leaves}
        if len(dtypes) != 1:
            raise ValueError(f"the pipeline stores parameters per stage in one array, but they have dtypes "
                             f"{sorted(map(str, dtypes))}; give every parameter the same param_dtype")
        used, offset = [0] * stages, []
        for leaf, d in zip(leaves, leaf_device, strict=True):
            offset.append(used[d])
            used[d] += math.prod(leaf.shape)
        width = -(-max(max(used), 1) // multiple) * multiple
        return cls(stages, treedef, tuple(tuple(leaf.shape) for leaf in leaves), dtypes.pop(), tuple(leaf_device),
                   tuple(offset), width)

    def abstract_tree(self):
        """The parameter tree as ``jax.ShapeDtypeStruct`` leaves."""
        return jax.tree.unflatten(self.treedef, [jax.ShapeDtypeStruct(s, self.dtype) for s in self.shapes])

    def _on(self, d: int) -> list[int]:
        return [i for i, dev in enumerate(self.device) if dev == d]

    def row(self, d: int, leaves: dict[int, jax.Array]) -> jax.Array:
        """Row ``d`` ``[width]`` holding ``leaves`` (leaf index -> array) of device ``d``, zeros elsewhere."""
        parts, end = [], 0
        for i in self._on(d):
            size = math.prod(self.shapes[i])
            parts.append(leaves[i].reshape(-1).astype(self.dtype) if i in leaves else jnp.zeros(size, self.dtype))
            end += size
        parts.append(jnp.zeros(self.width - end, self.dtype))
        return jnp.concatenate(parts)

    def leaves_of(self, row: jax.Array, d: int) -> dict[int, jax.Array]:
        """The parameters of device ``d`` from its row ``[width]``: leaf index -> array."""
        return {i: row[self.offset[i]:self.offset[i] + math.prod(self.shapes[i])].reshape(self.shapes[i])
                for i in self._on(d)}

    def pack(self, params) -> jax.Array:
        """The parameter tree -> ``[S, width]``."""
        leaves = jax.tree.leaves(params)
        if len(leaves) != len(self.shapes):
            raise ValueError(f"pack: {len(leaves)} leaves, the packing has {len(self.shapes)}")
        return jnp.stack([self.row(d, dict(enumerate(leaves))) for d in range(self.stages)])

    def unpack(self, packed: jax.Array):
        """``[S, width]`` -> the parameter tree."""
        leaves = [packed[d, o:o + math.prod(s)].reshape(s)
                  for d, o, s in zip(self.device, self.offset, self.shapes, strict=True)]
        return jax.tree.unflatten(self.treedef, leaves)

    def is_packed(self, x) -> bool:
        return hasattr(x, "shape") and tuple(x.shape) == (self.stages, self.width)

    def _is_tree(self, x) -> bool:
        try:
            return jax.tree.structure(x) == self.treedef
        except Exception:  # noqa: BLE001 - leaves and foreign nodes
            return False

    def pack_state(self, state):
        """A ``TrainState`` with its parameters and the parameter-shaped parts of its optimizer state packed."""
        opt = jax.tree.map(lambda x: self.pack(x) if self._is_tree(x) else x, state.opt_state, is_leaf=self._is_tree)
        return state.replace(params=self.pack(state.params), opt_state=opt)

    def unpack_state(self, state):
        """Inverse of ``pack_state``."""
        opt = jax.tree.map(lambda x: self.unpack(x) if self.is_packed(x) else x, state.opt_state)
        return state.replace(params=self.unpack(state.params), opt_state=opt)
