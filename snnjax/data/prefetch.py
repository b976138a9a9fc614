"""A background thread that runs an iterator a few items ahead of its consumer."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def prefetch(iterator: Iterator[T], size: int) -> Iterator[T]:
    """Yields the items of ``iterator`` in order, produced up to ``size`` ahead in a daemon thread.

    Exceptions raised by ``iterator`` are re-raised in the consumer. Closing the
    returned generator (e.g. ``break`` out of a loop) stops the thread.
    ``size <= 0`` returns ``iterator`` unchanged.
    """
    if size <= 0:
        return iterator
    buffer: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in iterator:
                if not put(item):
                    return
        except BaseException as error:  # noqa: BLE001 (re-raised in the consumer)
            put(_Failure(error))
            return
        put(_DONE)

    def consume() -> Iterator[T]:
        thread = threading.Thread(target=produce, name="snnjax-prefetch", daemon=True)
        thread.start()  # on the first next(), so an unused generator leaves no thread behind
        try:
            while True:
                item = buffer.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            stop.set()
            thread.join()

    return consume()
