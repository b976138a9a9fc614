"""The threads that decode a batch's examples (the ``num_workers`` option of the sources that read files)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


class Workers:
    """Maps a per-example function over a batch on ``count`` threads (1: the caller's thread).

    The pool starts on the first batch of more than one example and is shared by copies of the source.
    Decoding, resizing and most NumPy work on whole arrays release the GIL, so threads overlap them.
    """

    def __init__(self, count: int, name: str):
        if int(count) != count or count < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {count!r} (data.options.num_workers / "
                             "num_workers=)")
        self.count = int(count)
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[[A], B], items: Sequence[A]) -> list[B]:
        """``[fn(x) for x in items]``, in order, computed on the threads."""
        if self.count == 1 or len(items) < 2:
            return [fn(x) for x in items]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.count, thread_name_prefix=f"snnjax-{self.name}")
        return list(self._pool.map(fn, items))
