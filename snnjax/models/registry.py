"""Model registry: build a model by name from config-style keyword arguments, its sizes read from the data; and
each family's SpikingJelly weight-import table.

Each model file registers its names (``register``) with its constructor and how its input/output
sizes follow from the data (:class:`DataShape`), so the trainer needs no per-model code, and its class's
weight-import table (``register_rules``: a list of :class:`Rule`, torch module -> snnjax module), so the importer
(``snnjax.interop``) needs none either: a new family registers from its own file (imported by ``snnjax.models``).
The table's type lives here, not in ``snnjax.interop``, because models may not import the interop package (it
imports them: ``tests/test_architecture.py``); a rule's ``kind`` is a name, which the importer maps to its
converter (``snnjax.interop.rules.KINDS``).

Config values: ``spiking_neuron`` is a neuron name (``IF``, ``LIF``, ``PLIF``, a catalogue class's name);
``surrogate_function`` a surrogate name (``"atan"``); a neuron keyword left None is not given (the neuron's or the
model's default applies), except ``v_reset``, where None is the soft reset (its config default is 0.0, every
neuron's own; not given to a neuron class without the keyword, such as the ``NonSpiking*`` readouts).
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
from flax import nnx

from snnjax.models.neuron_options import KEYWORD_TYPES, neuron_class
from snnjax.neurons import IMPLS, set_impl
from snnjax.neurons import surrogate as sg


@dataclasses.dataclass(frozen=True)
class DataShape:
    """What the data says about a model's sizes.

    Attributes:
      frame_shape: one example at one time step, ``(H, W, C)`` (images and event frames alike).
      num_classes: number of classes.
      time_steps: ``T``, the time steps the model sees.
    """

    frame_shape: tuple[int, ...]
    num_classes: int
    time_steps: int

    @classmethod
    def of(cls, source: Any, time_steps: int) -> DataShape:
        """The shape of ``source`` (a :class:`snnjax.data.Source`: ``example_shape``, ``num_classes``, ``time_steps``).

        ``time_steps`` is the ``T`` the encoder gives static images; event sources carry their own.
        """
        event_steps = getattr(source, "time_steps", None)
        shape = tuple(source.example_shape)
        if event_steps is not None:  # event frames [T, H, W, C]: their own time axis
            return cls(shape[1:], int(source.num_classes), int(event_steps))
        return cls(shape, int(source.num_classes), int(time_steps))


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered model: its constructor, and its size keywords as a function of the data and its options."""

    build: Callable[..., nnx.Module]
    sizes: Callable[[DataShape, Mapping[str, Any]], dict[str, Any]]
    size_keys: tuple[str, ...]  # the keywords ``sizes`` returns (left out of model_config)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the preset's constructor keywords
    option_types: Mapping[str, type] = dataclasses.field(default_factory=dict)  # types of options defaulting to None


REGISTRY: dict[str, ModelEntry] = {}


def register(name: str, build: Callable[..., nnx.Module], sizes: Callable[[DataShape, Mapping[str, Any]], dict],
             size_keys: tuple[str, ...], defaults: Mapping[str, Any] | None = None,
             option_types: Mapping[str, type] | None = None) -> None:
    """Register model ``name`` (a config's ``model.name``): ``build(**options, **sizes, rngs=, dtype=, param_dtype=)``.

    ``sizes(data, options)`` returns the ``size_keys`` keywords from the data; ``defaults`` are the preset's
    constructor keywords; ``option_types`` the types of constructor options whose default is None (so a config
    holds a typed placeholder the command line can set). A constructor taking ``**kwargs`` (the neuron keywords,
    ``snnjax.models.neuron_options``) gets the config keys ``KEYWORD_TYPES``.
    """
    old = REGISTRY.get(name)
    if old is not None and (old.build.__module__, old.build.__qualname__) != (build.__module__, build.__qualname__):
        raise ValueError(f"model {name!r} is already registered by {old.build.__module__}.{old.build.__qualname__}")
    REGISTRY[name] = ModelEntry(build, sizes, tuple(size_keys), dict(defaults or {}), dict(option_types or {}))


# The layer kinds a Rule may name; ``snnjax.interop.rules.KINDS`` maps each to the parameters' renaming and layout.
RULE_KINDS = ("conv", "linear", "flat_linear", "bn", "ws_conv", "ws_linear", "neuron")


@dataclasses.dataclass(frozen=True)
class Rule:
    """torch module prefix ``pattern`` (a regular expression, a full match) -> snnjax module ``target``, of ``kind``.

    ``target`` is a dotted module path whose ``{1}``, ``{2}``, ... or ``{name}`` fields are the expression's groups;
    ``kind`` (one of ``RULE_KINDS``) says how the module's parameters are renamed and laid out (``conv``, ``linear``,
    ``bn``; ``flat_linear``, a linear layer after a flatten of ``[C, H, W]``, needs the model's ``feature_shape``,
    the ``[H, W, C]`` it flattens; ``neuron``: a learned neuron parameter such as PLIF's ``w``; see
    ``snnjax.interop.rules``).
    """

    pattern: str
    target: str
    kind: str

    def __post_init__(self):
        if self.kind not in RULE_KINDS:
            raise ValueError(f"Rule kind must be one of {RULE_KINDS}, got {self.kind!r} (rule {self.pattern!r})")


# Model class -> its family's weight-import table, a function of the model (its depth, pools, ...).
IMPORT_TABLES: dict[type, Callable[[nnx.Module], Sequence[Rule]]] = {}


def register_rules(cls: type, rules: Sequence[Rule] | Callable[[nnx.Module], Sequence[Rule]]) -> None:
    """Register the SpikingJelly weight-import table of model class ``cls`` and its subclasses: a list of
    :class:`Rule` (the first whose pattern matches a torch key's module prefix wins), or a function of the model
    returning one. ``snnjax.interop.import_state_dict`` then loads SpikingJelly checkpoints into the model."""
    if not isinstance(cls, type):
        raise TypeError(f"register_rules takes the model class as cls, got {cls!r}")
    if cls in IMPORT_TABLES:
        raise ValueError(f"{cls.__module__}.{cls.__qualname__} already has an import table; register one per class")
    IMPORT_TABLES[cls] = rules if callable(rules) else (lambda model, fixed=tuple(rules): fixed)


def import_table(model: nnx.Module) -> Sequence[Rule] | None:
    """The weight-import table of ``model``'s class, or of its nearest registered base class; None if none has one."""
    for cls in type(model).__mro__:
        if cls in IMPORT_TABLES:
            return IMPORT_TABLES[cls](model)
    return None


def image_frame(data: DataShape, model: str) -> tuple[int, int, int]:
    """``(H, W, C)`` of image data, or a ``ValueError`` saying ``model`` takes image frames."""
    if len(data.frame_shape) != 3:
        raise ValueError(f"model {model!r} takes image frames [H, W, C]; the data gives examples of shape "
                         f"{data.frame_shape} per time step: choose a model such as 'mlp' or image data")
    h, w, c = data.frame_shape
    return h, w, c


_BUILT_BY_TRAINER = {"rngs", "dtype", "param_dtype"}
# Options every model takes besides its constructor's: the multi-step neurons' implementation
# (``snnjax.neurons.kernels.dispatch``; set on the built model's neurons).
COMMON_OPTIONS = {"neuron_impl": "auto"}


def _parameters(name: str) -> dict[str, inspect.Parameter]:
    build = REGISTRY[name].build
    params = inspect.signature(build.__init__ if inspect.isclass(build) else build).parameters
    return {k: p for k, p in params.items() if k != "self"}


def _takes_neuron_keywords(name: str) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _parameters(name).values())


def sizes_from_data(name: str, data: DataShape, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Model ``name``'s size keywords (``in_features``, ``num_classes``, ...) for ``data``.

    ``options`` are the other constructor keywords the model will get (some sizes depend on them).

    Raises:
      ValueError: unknown model or option, or data the model cannot take (the message says what to change).
    """
    check_model_kwargs(name, options or {})
    options = {**REGISTRY[name].defaults, **(options or {})}
    return REGISTRY[name].sizes(data, options)


def allowed_kwargs(name: str) -> list[str]:
    """The constructor arguments a config may set for model ``name``."""
    named = [k for k, p in _parameters(name).items()
             if k not in _BUILT_BY_TRAINER and p.kind is not inspect.Parameter.VAR_KEYWORD]
    neuron = list(KEYWORD_TYPES) if _takes_neuron_keywords(name) else []
    return sorted(set(named + neuron + list(COMMON_OPTIONS)))


def model_config(name: str, **overrides: Any) -> ml_collections.ConfigDict:
    """Config of model ``name``: every constructor option with its default (surrogates by name), then ``overrides``.

    The sizes the data gives (the entry's ``size_keys``) are left out unless given in ``overrides``; the neuron
    keywords are unset placeholders (None: not given) but ``v_reset`` (0.0).
    """
    check_model_kwargs(name, overrides)
    entry, params = REGISTRY[name], _parameters(name)
    types = {**KEYWORD_TYPES, "spiking_neuron": str, **entry.option_types}
    c = ml_collections.ConfigDict({"name": name})
    for key in allowed_kwargs(name):
        if key in COMMON_OPTIONS:
            c[key] = COMMON_OPTIONS[key]
            continue
        if key in entry.size_keys:
            continue
        if key in params:
            default = params[key].default
            if default is inspect.Parameter.empty:
                continue
        else:  # a neuron keyword: not given
            default = 0.0 if key == "v_reset" else None
        default = entry.defaults.get(key, default)
        if key == "surrogate_function" and default is not None:
            default = sg.name_of(default)
        # An option left unset (None) stays overridable from the command line, with its type.
        c[key] = ml_collections.config_dict.placeholder(types[key]) if default is None and key in types else default
    for key, value in overrides.items():
        c[key] = value
    return c


def check_model_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the model, the bad keys and the allowed ones."""
    if name not in REGISTRY:
        raise ValueError(f"model.name={name!r} is not a model; choose one of {sorted(REGISTRY)}")
    allowed = allowed_kwargs(name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"model {name!r} has no option(s) {unknown}; allowed: {allowed}")


def create_model(name: str, kwargs: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=None) -> nnx.Module:
    """Model ``name`` built from config values ``kwargs`` (see the module docstring: names for the neuron class and
    the surrogate, None for a neuron keyword not given; lists become tuples)."""
    check_model_kwargs(name, kwargs)
    kwargs = {**REGISTRY[name].defaults, **kwargs}
    impl = kwargs.pop("neuron_impl", COMMON_OPTIONS["neuron_impl"])
    if impl not in IMPLS:
        raise ValueError(f"model.neuron_impl={impl!r} is not a neuron implementation; choose one of {list(IMPLS)}")
    if isinstance(kwargs.get("surrogate_function"), str):
        kwargs["surrogate_function"] = sg.get(kwargs["surrogate_function"])
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()
              if not (k in KEYWORD_TYPES and k != "v_reset" and v is None)}
    chosen = neuron_class(kwargs.get("spiking_neuron"))
    if chosen is not None and kwargs.get("v_reset") == 0.0 and \
            "v_reset" not in inspect.signature(chosen.__init__).parameters:
        del kwargs["v_reset"]  # the config's default, for a neuron without one (NonSpikingLIFNode, ILIFNode, ...)
    model = REGISTRY[name].build(**kwargs, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    set_impl(model, impl)
    return model
