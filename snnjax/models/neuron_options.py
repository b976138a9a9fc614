"""Which spiking neuron a model builds at each site: SpikingJelly's ``spiking_neuron`` + ``**kwargs``.

SpikingJelly's zoo models take a neuron class and keyword arguments shared by every neuron.
With ``spiking_neuron=None`` they build ``LIFNode`` and some sites add their own defaults (the
attention modules: ``tau=2, detach_reset=True``, and ``v_threshold=0.5`` for the attention-map
neuron), which given keywords override. Here the same choice is explicit and typed (config
friendly): one neuron kind and its keywords for every site, plus the attention sites'
``detach_reset`` and attention-map ``v_threshold`` as their own options.

SpikingJelly ``spiking_neuron=None`` without ``detach_reset`` / ``v_threshold`` keywords is
``NeuronOptions()`` (the defaults). A given neuron class uses the same keywords at every site:
``NeuronOptions(kind, ..., attn_detach_reset=detach_reset, attn_v_threshold=v_threshold)``
(``NeuronOptions.uniform``).

Models whose every site shares one set of defaults (MS-ResNet's LIF with ``tau=4/3``,
``v_threshold=0.5``, ...) take the keywords as optional (None: not given) and resolve them with
``NeuronOptions.resolve``, SpikingJelly's ``_make_multi_step_neuron``: the model's defaults apply
only without a neuron kind.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from snnjax.neurons import IFNode, LIFNode, ParametricLIFNode
from snnjax.neurons import surrogate as sg
from snnjax.neurons.modules import BaseNode

KINDS = ("LIF", "IF", "PLIF")


@dataclasses.dataclass(frozen=True)
class NeuronOptions:
    """Every neuron of a model: ``kind`` (``LIF``, ``IF``, ``PLIF``) with SpikingJelly's keywords.

    ``tau`` is LIF's time constant and PLIF's ``init_tau``; ``decay_input`` applies to LIF and PLIF.
    Sites inside attention modules take ``attn_detach_reset`` instead of ``detach_reset``, and the
    attention-map neuron ``attn_v_threshold`` instead of ``v_threshold``.
    """

    kind: str = "LIF"
    tau: float = 2.0
    decay_input: bool = True
    v_threshold: float = 1.0
    v_reset: float | None = 0.0
    surrogate_function: sg.Surrogate = sg.Sigmoid()
    detach_reset: bool = False
    attn_detach_reset: bool = True
    attn_v_threshold: float = 0.5

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"spiking_neuron must be one of {KINDS}, got {self.kind!r}")
        if self.kind != "IF" and not self.tau > 1.0:
            raise ValueError(f"tau must be > 1 for {self.kind} neurons, got {self.tau}")

    @classmethod
    def uniform(cls, kind: str = "LIF", **kwargs) -> NeuronOptions:
        """Every site the same neuron (SpikingJelly with an explicit ``spiking_neuron`` class)."""
        base = cls(kind=kind, **kwargs)
        return dataclasses.replace(base, attn_detach_reset=base.detach_reset, attn_v_threshold=base.v_threshold)

    @classmethod
    def resolve(cls, spiking_neuron: str | None, model_defaults: Mapping[str, Any], *, v_reset: float | None,
                **keywords: Any) -> NeuronOptions:
        """Every site the same neuron, chosen as SpikingJelly's ``_make_multi_step_neuron`` chooses it.

        ``spiking_neuron=None``: LIF with ``model_defaults`` (``NeuronOptions`` field names), the given
        ``keywords`` over them. A kind (``LIF``, ``IF``, ``PLIF``): the given ``keywords`` over that neuron's own
        SpikingJelly defaults (the fields' defaults); the model's are dropped. A keyword is given when not None
        (``v_reset`` is always given: None there means soft reset).
        """
        given = {k: v for k, v in keywords.items() if v is not None}
        chosen = {**model_defaults, **given} if spiking_neuron is None else given
        return cls.uniform("LIF" if spiking_neuron is None else spiking_neuron, v_reset=v_reset, **chosen)

    def make(self, site: str = "plain") -> BaseNode:
        """A multi-step neuron for ``site``: ``plain``, ``attn`` (inside attention) or ``attn_map``."""
        if site not in ("plain", "attn", "attn_map"):
            raise ValueError(f"site must be 'plain', 'attn' or 'attn_map', got {site!r}")
        kw = dict(v_threshold=self.attn_v_threshold if site == "attn_map" else self.v_threshold,
                  v_reset=self.v_reset, surrogate_function=self.surrogate_function,
                  detach_reset=self.detach_reset if site == "plain" else self.attn_detach_reset, step_mode="m")
        if self.kind == "IF":
            return IFNode(**kw)
        if self.kind == "LIF":
            return LIFNode(tau=self.tau, decay_input=self.decay_input, **kw)
        return ParametricLIFNode(init_tau=self.tau, decay_input=self.decay_input, **kw)
