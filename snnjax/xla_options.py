"""XLA settings the library compiles with, and making them the process default for plain ``jax.jit``.

``CPU_CONV_OPTIONS``: on the CPU, convolutions on XLA's Eigen runtime rather than YNNPACK (faster for
spiking conv nets' shapes; measured in ``snnjax.layers.conv_cpu``). The library's own steps pass them
as ``compiler_options`` (``conv_cpu.compiler_options``); ``import snnjax`` also makes them XLA's default
(``use_by_default``) so that model code a user jits with plain ``jax.jit`` convolves the same way.
This module imports nothing of snnjax, so ``snnjax/__init__`` can run it before any other import.
"""
from __future__ import annotations

import os
import pkgutil

# The YNNPACK fusion kinds XLA:CPU enables by default (jax 0.10), less its convolutions.
CPU_CONV_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type":
                    "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"}


def use_by_default() -> bool:
    """Append ``CPU_CONV_OPTIONS`` to ``XLA_FLAGS``, making them the default of every compile in this process;
    returns whether it did.

    XLA reads ``XLA_FLAGS`` once, when JAX starts its backends, so this acts only before that (``import snnjax``
    before running any JAX computation), only where the user's ``XLA_FLAGS`` does not name the setting (theirs
    wins), and not where a GPU plugin is installed (unless ``JAX_PLATFORMS=cpu``): the setting is for the CPU.
    """
    from jax._src import xla_bridge  # noqa: PLC0415 (whether the backends started; JAX has no public query)

    flags = os.environ.get("XLA_FLAGS", "")
    ((name, value),) = CPU_CONV_OPTIONS.items()
    if name in flags or xla_bridge.backends_are_initialized():
        return False
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() != "cpu" and _gpu_plugin_installed():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} --{name}={value}".strip()
    return True


def _gpu_plugin_installed() -> bool:
    try:
        import jax_plugins  # noqa: PLC0415 (JAX's namespace package for PJRT plugins; absent without any)
    except ImportError:
        return False
    return any(k in m.name for m in pkgutil.iter_modules(jax_plugins.__path__) for k in ("cuda", "rocm"))
