"""A model's layers as its own forward calls them: recorded calls, the chain they form, its neurons.

``layer_chain(model, x)`` runs ``model(x)`` and records every innermost module call (a module of
``model`` that calls no other module of it: a convolution, a BatchNorm, a neuron, ...) in the order the
forward makes them, with its input and output. The calls form a *chain* when each one takes the previous
one's output (the first the model's input, the model returning the last one's), i.e. no residual,
attention or operation outside a layer module sits between them; NIR export and operation counts take
such models (``snnjax.Sequential``, ``SpikingMLP``, ``CIFAR10DVSVGG``, a model of your own written the
same way) and refuse others with :class:`UnsupportedModelError`. Nothing is described twice: the chain
is whatever the model's ``__call__`` does.

Recording wraps ``__call__`` of the model's module classes while it runs (as ``nnx.capture`` does for
method outputs) and restores them afterwards; the model is not changed. Checkpointing policies
(``snnjax.models.remat``) do not change a forward's values and are set aside while recording.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any

import jax
from flax import nnx

from snnjax.models import remat
from snnjax.neurons.modules import BaseNode


class UnsupportedModelError(ValueError):
    """The model is not what the deployment step needs (a chain of layers, neurons that carry state); the
    message says what and where."""


@dataclasses.dataclass(frozen=True, eq=False)
class Call:
    """One innermost module call: ``name`` (the module's attribute path, e.g. ``"features.3.conv"``), the
    ``module``, its input ``x`` and output ``y`` (``[T, N, ...]``; tracers inside a trace)."""

    name: str
    module: nnx.Module
    x: Any
    y: Any


def dotted(path: tuple) -> str:
    return ".".join(map(str, path))


def neurons(model: nnx.Module) -> list[tuple[str, BaseNode]]:
    """``(path, neuron)`` of every spiking neuron of ``model``, in attribute-path order (``nnx.iter_modules``)."""
    return [(dotted(p), m) for p, m in nnx.iter_modules(model) if isinstance(m, BaseNode)]


_RECORDER: contextvars.ContextVar = contextvars.ContextVar("snnjax_deploy_recorder", default=None)


class _Recorder:
    def __init__(self, names: dict[int, str]):
        self.names, self.calls, self.stack = names, [], []

    def call(self, module, method, args, kwargs):
        if any(frame[0] is module for frame in self.stack):  # a subclass's __call__ reaching its base's
            return method(module, *args, **kwargs)
        if self.stack:
            self.stack[-1][1] = True
        frame = [module, False]
        self.stack.append(frame)
        try:
            y = method(module, *args, **kwargs)
        finally:
            self.stack.pop()
        if not frame[1] and id(module) in self.names:
            self.calls.append(Call(self.names[id(module)], module, args[0] if len(args) == 1 else args, y))
        return y


def _wrap(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        recorder = _RECORDER.get()
        if recorder is None:
            return method(self, *args, **kwargs)
        return recorder.call(self, method, args, kwargs)

    wrapper._snnjax_records = True
    return wrapper


@contextlib.contextmanager
def _recording(model: nnx.Module):
    names: dict[int, str] = {}
    for path, m in nnx.iter_modules(model):
        names.setdefault(id(m), dotted(path))
    patched = []
    for cls in {type(m) for _, m in nnx.iter_modules(model)}:
        if getattr(cls.__call__, "_snnjax_records", False):
            continue
        patched.append((cls, cls.__dict__.get("__call__")))
        cls.__call__ = _wrap(cls.__call__)
    recorder = _Recorder(names)
    token = _RECORDER.set(recorder)
    try:
        yield recorder.calls
    finally:
        _RECORDER.reset(token)
        for cls, own in reversed(patched):
            if own is None:
                del cls.__call__
            else:
                cls.__call__ = own


def layer_chain(model: nnx.Module, x: jax.Array) -> tuple[jax.Array, list[Call]]:
    """``model(x)`` and its innermost module calls in order, checked to be a chain (see the module docstring).

    Raises:
      UnsupportedModelError: naming the first call that does not take the previous one's output.
    """
    settings = remat.memory_settings(model)
    if settings != remat.NONE:
        remat.configure(model, remat.NONE)
    try:
        with _recording(model) as calls:
            y = model(x)
    finally:
        if settings != remat.NONE:
            remat.configure(model, settings)
    what = f"{type(model).__name__} is not a chain of layers"
    why = ("NIR and operation counts take a model whose layer modules each take the previous one's output "
           "(residual blocks, attention and operations outside a layer module are not supported)")
    previous, source = x, "the model's input"
    for c in calls:
        if c.x is not previous:
            raise UnsupportedModelError(f"{what}: {c.name} ({type(c.module).__name__}) does not take {source}; {why}")
        previous, source = c.y, f"the output of {c.name}"
    if y is not previous:
        raise UnsupportedModelError(f"{what}: its output is not {source}; {why}")
    return y, calls
