"""The GPU-facing choices of the fused neuron kernels, in one place.

The kernels are lowered through Pallas' Triton backend. (On jax 0.11.2 on an H100,
``pl.pallas_call`` with Mosaic GPU compiler parameters found no GPU lowering rule; a
``plgpu.kernel`` rewrite has little to win on a memory-bound elementwise recurrence that
the Triton kernels already run near the copy rate.)

- ``block_m`` / ``block_m_backward``: neurons per program (one grid step). The forward
  carries one value per neuron (V); the backward keeps a time chunk of H per neuron
  live (the reverse sweep needs it in reverse order), so it gets a smaller block to
  keep them in registers. Blocks are clamped to the next power of two >= M (Triton wants
  power-of-two tensor sizes) and never below ``min_block``; in interpret mode a small M is
  one block of exactly M.
- ``num_warps`` / ``num_warps_backward`` / ``num_stages``: Triton launch parameters.
- ``time_chunk``: steps per chunk (K). The forward checkpoints V every K steps; the
  backward recomputes and keeps K rows of H at a time (registers), so K trades
  checkpoint bytes (8/K per neuron-step) against live registers.
- ``interpret``: ``None`` runs the kernels with ``interpret=True`` exactly when the default
  backend is the CPU (the only way Pallas runs there).

Defaults from ``python -m snnjax.bench.pallas_sweep`` on an H100 (jax 0.11.2, LIF over
``[T, 4Mi]`` float32, T = 8 and 32; records in ``benchmarks/results/``): forward blocks of
512 to 2048 with 8 warps ran within 5% of each other (T=32: 2.3 to 2.5 TB/s counting X
read and S written); backward blocks of 256 with 4 warps and chunks of 8 were best at
T=32 (0.65 ms, 2.5 TB/s counting X and dS read and dX written) and within 0.5% at T=8.
Before chunking, the backward kept all T rows of H live: 0.88 ms at T=32 at best, and
twice that with 8 neurons per thread (register spills; ``pallas_sweep_h100_unchunked.jsonl``).
"""
from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """Block sizes, Triton launch parameters and interpret mode (hashable: a static argument)."""

    block_m: int = 1024
    block_m_backward: int = 256
    min_block: int = 128
    num_warps: int = 8
    num_warps_backward: int = 4
    num_stages: int = 1
    time_chunk: int = 8
    interpret: bool | None = None

    def __post_init__(self):
        for name in ("block_m", "block_m_backward", "min_block", "num_warps", "num_warps_backward"):
            b = getattr(self, name)
            if b < 1 or b & (b - 1):
                raise ValueError(f"{name} must be a power of two, got {b}")
        if self.time_chunk < 1:
            raise ValueError(f"time_chunk must be at least 1, got {self.time_chunk}")

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
        need = max(1, (m - 1).bit_length())
        return min(b, max(self.min_block, 1 << need))

    def compiler_params(self, backward: bool = False):
        """Triton ``compiler_params`` for ``pl.pallas_call`` (None in interpret mode)."""
        if self.use_interpret():
            return None
        from jax.experimental.pallas import triton as pl_triton  # noqa: PLC0415 (GPU only)

        return pl_triton.CompilerParams(num_warps=self.num_warps_backward if backward else self.num_warps,
                                        num_stages=self.num_stages)


DEFAULT = KernelOptions()
