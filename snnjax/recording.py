"""Trace-time records: what the neurons and layers chose while a model was traced, for ``print(plan)``.

A ``Recorder`` is a context-local list: code that decides something at trace time ``add``s to it, and only within
``recording()`` (a plan tracing its model for shapes) does anything keep what was added.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any


class Recorder:
    """Collects what is ``add``ed while a ``recording()`` is active (nested recordings: the innermost)."""

    def __init__(self, name: str):
        self._found: contextvars.ContextVar[list | None] = contextvars.ContextVar(name, default=None)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list]:
        """Within this context ``add`` appends to the list it yields."""
        found: list = []
        token = self._found.set(found)
        try:
            yield found
        finally:
            self._found.reset(token)

    def add(self, item: Any) -> None:
        """Append ``item`` where a ``recording()`` is active; nothing otherwise."""
        if (found := self._found.get()) is not None:
            found.append(item)
