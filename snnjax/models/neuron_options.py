"""The neurons of a zoo model: ``spiking_neuron`` and the keywords every neuron gets, as SpikingJelly chooses them.

Every zoo constructor takes ``spiking_neuron`` and the neuron keywords as ``**kwargs`` (``tau``,
``init_tau`` (PLIF's), ``v_threshold``, ``v_reset`` (None: soft reset), ``decay_input``,
``detach_reset``, ``surrogate_function``, ``step_mode``, and the neuron classes' other keywords such
as ``store_v_seq``), and builds each neuron site as SpikingJelly does:

- an explicit ``spiking_neuron`` class: ``spiking_neuron(**kwargs)`` at every site, the given
  keywords over that class's own defaults (``detach_reset=False``, ``Sigmoid()``, ``v_threshold=1.0``,
  ``v_reset=0.0``, ``tau`` / ``init_tau`` 2.0, ``decay_input=True``), attention sites included;
- ``spiking_neuron=None``: ``LIFNode`` with the site's own defaults (the model's, e.g. MS-ResNet's
  ``tau=4/3``; inside attention ``tau=2, detach_reset=True`` and ``v_threshold=0.5`` for the attention
  map), the given keywords over them. Models that SpikingJelly builds only from a given class (the
  ResNets, the parametric-LIF nets) refuse None.

``spiking_neuron`` is a neuron class of ``snnjax.neurons`` (``IFNode``, ``LIFNode``, ``ParametricLIFNode``, the
catalogue's such as ``CUBALIFNode``, or a user's ``BaseNode`` subclass) or, as an snnjax convenience for
configs, a name of ``NEURONS`` (``"IF"``, ``"LIF"``, ``"PLIF"``, and the catalogue's class names). Neurons are
multi-step (``step_mode="m"``, the only value accepted). A keyword the chosen class does not take
(``tau`` for ``IFNode``, ``init_tau`` for ``LIFNode``) raises ``ValueError`` naming it.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from snnjax.neurons import IFNode, LIFNode, OTTTLIFNode, ParametricLIFNode, SLTTLIFNode, catalogue
from snnjax.neurons import surrogate as sg
from snnjax.neurons.modules import BaseNode

NEURONS: dict[str, type[BaseNode]] = {"IF": IFNode, "LIF": LIFNode, "PLIF": ParametricLIFNode,
                                      **{name: getattr(catalogue, name) for name in catalogue.__all__},
                                      "OTTTLIFNode": OTTTLIFNode, "SLTTLIFNode": SLTTLIFNode}
# The neuron keywords a config may set (the constructors' ``**kwargs``), with their types for an unset (None) value.
KEYWORD_TYPES: dict[str, type] = {"tau": float, "init_tau": float, "decay_input": bool, "v_threshold": float,
                                  "v_reset": float, "surrogate_function": str, "detach_reset": bool,
                                  "c_decay": float, "v_decay": float}  # the last two: CUBALIFNode's
_HINTS = {"backend": "snnjax picks the neuron implementation with impl= (model.neuron_impl in a config)",
          "tau": "ParametricLIFNode's initial time constant is init_tau; IFNode has none",
          "init_tau": "init_tau is ParametricLIFNode's; LIFNode takes tau, IFNode neither"}


def neuron_class(spiking_neuron: type[BaseNode] | str | None) -> type[BaseNode] | None:
    """The class ``spiking_neuron`` names: a ``snnjax.neurons`` class, a name of ``NEURONS`` or None."""
    if spiking_neuron is None:
        return None
    if isinstance(spiking_neuron, str):
        if spiking_neuron not in NEURONS:
            raise ValueError(f"spiking_neuron={spiking_neuron!r} is not a neuron name; choose one of {list(NEURONS)} "
                             "or pass a class such as snnjax.neurons.LIFNode")
        return NEURONS[spiking_neuron]
    if not (inspect.isclass(spiking_neuron) and issubclass(spiking_neuron, BaseNode)):
        raise TypeError(f"spiking_neuron must be a snnjax neuron class (snnjax.neurons.IFNode, LIFNode, "
                        f"ParametricLIFNode, CUBALIFNode, ..., or a BaseNode subclass), its name or None, "
                        f"got {spiking_neuron!r}")
    return spiking_neuron


def _check_keywords(cls: type[BaseNode], kwargs: Mapping[str, Any], model: str) -> None:
    params = inspect.signature(cls.__init__).parameters
    for key in kwargs:
        if key not in params or key == "self":
            hint = f" ({_HINTS[key]})" if key in _HINTS else ""
            allowed = sorted(k for k in params if k != "self")
            raise ValueError(f"{model} takes no keyword {key!r}{hint}: it is neither the model's nor a keyword of "
                             f"{cls.__name__}, the neuron it builds (whose keywords are {allowed})")
    if kwargs.get("step_mode", "m") != "m":
        raise ValueError(f"{model}: step_mode={kwargs['step_mode']!r}; the zoo's neurons are multi-step "
                         "(step_mode='m', input [T, N, ...])")


def from_spec(spec: Mapping[str, Any], where: str) -> BaseNode:
    """The multi-step neuron of ``spec``, ``{"type": NAME, **keywords}``: ``NAME`` one of ``NEURONS`` (default
    ``"LIF"``), the keywords the class's (a surrogate may be given by name). ``where`` names the spec in errors."""
    spec = dict(spec)
    name = spec.pop("type", "LIF")
    if name not in NEURONS:
        raise ValueError(f"{where}: type {name!r} is not one of {sorted(NEURONS)}")
    if isinstance(spec.get("surrogate_function"), str):
        spec["surrogate_function"] = sg.get(spec["surrogate_function"])
    _check_keywords(NEURONS[name], spec, where)
    return NEURONS[name](**{**spec, "step_mode": "m"})


@dataclasses.dataclass(frozen=True)
class Neurons:
    """A model's neuron choice: the ``spiking_neuron`` class (None: SpikingJelly's LIF with site defaults) and the
    keywords given. Build it with :meth:`of`; :meth:`make` builds one site's neuron."""

    spiking_neuron: type[BaseNode] | None
    kwargs: Mapping[str, Any]

    @classmethod
    def of(cls, spiking_neuron: type[BaseNode] | str | None, kwargs: Mapping[str, Any], *, model: str,
           required: bool = False) -> Neurons:
        """The checked choice of ``model`` (named in errors). ``required``: SpikingJelly's model has no neuron of
        its own, so None is refused."""
        chosen = neuron_class(spiking_neuron)
        if chosen is None and required:
            raise ValueError(f"{model} needs spiking_neuron (SpikingJelly's builds no neuron of its own): pass a "
                             f"class such as snnjax.neurons.IFNode, or a name from {list(NEURONS)}")
        _check_keywords(chosen or LIFNode, kwargs, model)
        return cls(chosen, dict(kwargs))

    def make(self, **site_defaults: Any) -> BaseNode:
        """A multi-step neuron: the class with the given keywords, or (no class) ``LIFNode`` with ``site_defaults``
        and the given keywords over them."""
        if self.spiking_neuron is None:
            return LIFNode(**{**site_defaults, **self.kwargs, "step_mode": "m"})
        return self.spiking_neuron(**{**self.kwargs, "step_mode": "m"})

    def without(self, *keys: str) -> Neurons:
        """The same choice with ``keys`` dropped from the keywords (Spikformer's attention with no class)."""
        return Neurons(self.spiking_neuron, {k: v for k, v in self.kwargs.items() if k not in keys})


# The attention sites' own defaults with spiking_neuron=None (SpikingJelly's attention modules).
ATTENTION = {"tau": 2.0, "detach_reset": True}
ATTENTION_MAP = {**ATTENTION, "v_threshold": 0.5}
