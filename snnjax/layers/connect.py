"""SEW-ResNet's connect functions (``cnf``): how a block's spikes join its identity path.

``ADD``: ``a + b``; ``AND``: ``a * b``; ``IAND``: ``a * (1 - b)`` (SpikingJelly's ``sew_function(a, b, cnf)``;
its basic block passes ``(identity, out)``, its bottleneck ``(out, identity)``).
"""
from __future__ import annotations

import jax

CONNECTS = ("ADD", "AND", "IAND")


def sew_connect(a: jax.Array, b: jax.Array, cnf: str) -> jax.Array:
    """``a`` joined with ``b`` by ``cnf`` (elementwise, any shape)."""
    if cnf == "ADD":
        return a + b
    if cnf == "AND":
        return a * b
    if cnf == "IAND":
        return a * (1.0 - b)
    raise ValueError(f"cnf must be one of {CONNECTS}, got {cnf!r}")
