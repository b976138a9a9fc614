"""The GPU-facing choices of the fused neuron kernels, in one place.

Nothing here has been tuned on a GPU yet; every choice is a field of ``KernelOptions``
so a GPU session can change it without touching the kernels:

- ``block_m`` / ``block_m_backward``: neurons per program (one grid step). The forward
  carries one value per neuron (V); the backward keeps T values of H per neuron live
  (the reverse sweep needs them in reverse order), so it gets a smaller default block to
  keep them in registers. Blocks are clamped to the next power of two >= M (Triton wants
  power-of-two tensor sizes) and never below ``min_block``; in interpret mode a small M is
  one block of exactly M.
- ``gpu_lowering``: ``"triton"`` (default) or ``"mosaic_gpu"``. Triton treats a block ref
  as a global-memory pointer and loads one ``[block]`` row per step, so ``T x block``
  is unbounded. Mosaic GPU's ``pl.pallas_call`` stages whole ``[T, block]`` blocks in
  shared memory through TMA (at most ~228 KiB on H100 for all operands and buffers,
  and TMA boxes of at most 256 per dimension), and jax >= 0.10 warns that
  ``pl.pallas_call`` for Mosaic GPU is deprecated in favour of ``plgpu.kernel``.
- ``num_warps`` / ``num_stages``: Triton launch parameters.
- ``interpret``: ``None`` runs the kernels with ``interpret=True`` exactly when the default
  backend is the CPU (the only way Pallas runs there).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax


MOSAIC_MAX_BOX = 256  # Mosaic GPU copies blocks with TMA: at most 256 elements per dimension


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """Block sizes, GPU lowering and interpret mode (hashable: a static argument)."""

    block_m: int = 1024
    block_m_backward: int = 256
    min_block: int = 128
    gpu_lowering: Literal["triton", "mosaic_gpu"] = "triton"
    num_warps: int = 4
    num_stages: int = 1
    interpret: bool | None = None

    def __post_init__(self):
        if self.gpu_lowering not in ("triton", "mosaic_gpu"):
            raise ValueError(f"gpu_lowering must be 'triton' or 'mosaic_gpu', got {self.gpu_lowering!r}")
        for name in ("block_m", "block_m_backward", "min_block"):
            b = getattr(self, name)
            if b < 1 or b & (b - 1):
                raise ValueError(f"{name} must be a power of two, got {b}")

    def use_interpret(self) -> bool:
        return jax.default_backend() == "cpu" if self.interpret is None else self.interpret

    def block(self, m: int, backward: bool) -> int:
        """Neurons per program for ``m`` neurons: the configured block, clamped to ``m`` rounded up.

        In interpret mode an ``m`` that fits one block gets a block of exactly ``m`` (one
        program, nothing to mask: the CPU interpreter is fastest that way); a larger ``m``
        gets the GPU's blocks, partial last block included.
        """
        b = self.block_m_backward if backward else self.block_m
        if self.use_interpret() and m <= b:
            return m
        if self.gpu_lowering == "mosaic_gpu" and not self.use_interpret():
            b = min(b, MOSAIC_MAX_BOX)
        need = max(1, (m - 1).bit_length())
        return min(b, max(self.min_block, 1 << need))

    def masked_rows(self) -> bool:
        """Whether row loads/stores of a partial last block need masks (Triton; see ``lanes``)."""
        return self.gpu_lowering == "triton"

    def compiler_params(self):
        """``compiler_params`` for ``pl.pallas_call`` (None in interpret mode); picks the GPU lowering."""
        if self.use_interpret():
            return None
        if self.gpu_lowering == "triton":
            from jax.experimental.pallas import triton as pl_triton

            return pl_triton.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)
        from jax.experimental.pallas import mosaic_gpu as plgpu

        return plgpu.CompilerParams(dimension_semantics=["parallel"])


DEFAULT = KernelOptions()
