"""Test configuration: 8 host CPU devices, set before jax is imported anywhere."""
import os

# XLA:CPU's MLIR fusion emitters build an MLIR context and pass pipeline per fused kernel: a third of the
# suite's compile time (the QKFormer pipeline layout test: 17.5 s -> 11.8 s without them). The tests compile
# their fusions with the elemental emitters instead (the train.py and launcher processes they start too);
# ``bench`` and ``train.py`` keep XLA's default. The two emitters can differ in a result's last bit, so a test
# that sets a child's XLA_FLAGS puts this in front (``helpers.child_env``): processes compared bitwise
# compile alike.
COMPILE_SPEED_FLAGS = "--xla_cpu_use_fusion_emitters=false"
_FLAGS = os.environ.get("XLA_FLAGS", "")
if "xla_cpu_use_fusion_emitters" not in _FLAGS:
    _FLAGS += " " + COMPILE_SPEED_FLAGS
os.environ["XLA_FLAGS"] = (_FLAGS + " --xla_force_host_platform_device_count=8").strip()
# The processes that run user code (examples/ scripts and notebooks, the docs' snippets) check that it runs and what
# it prints: they compile without XLA's expensive optimisations (``quick_compiles`` below, by its environment
# variable): 12-32% less CPU time for those test files (measured A/B on the 2-core machine).
QUICK_COMPILES_ENV = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# threefry compiles slowly on XLA:CPU (about 3 s per new parameter shape on the CI machine); the
# RngBitGenerator-based PRNG compiles in a tenth of that. Tests never depend on specific random bits.
os.environ.setdefault("JAX_DEFAULT_PRNG_IMPL", "rbg")
# One XLA compilation cache for the session, shared by the xdist workers and the train.py / launcher
# subprocesses the tests start (they inherit the environment): a program compiled once (a resumed run's
# step, a re-traced closure, the small eager ops every process runs) is not compiled again. The
# controller process creates it; workers find it set. Programs with host callbacks are never cached.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="snnjax-tests-xla-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import contextlib  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run, so CI passes or fails reproducibly; set
# SNNJAX_HYPOTHESIS_RANDOM=1 to explore new random examples (tests/test_neuron_impls.py).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("random", derandomize=False)
settings.load_profile("random" if os.environ.get("SNNJAX_HYPOTHESIS_RANDOM") == "1" else "repeatable")

REFERENCE_DIR = pathlib.Path(__file__).resolve().parent / "fixtures" / "spikingjelly"
NEURON_ARRAYS = ("x", "spikes", "v_seq", "grad_spikes", "grad_x")  # every neuron case has these


@pytest.fixture(scope="session")
def reference_dir() -> pathlib.Path:
    """The SpikingJelly golden data shipped with the tests (``tests/fixtures/spikingjelly``)."""
    return REFERENCE_DIR


def _case_id(i: int, case: dict) -> str:
    parts = [f"case{i:03d}", case.get("kind", "?")]
    if "tau" in case:
        parts.append(f"tau{case['tau']}")
    if "init_tau" in case:
        parts.append(f"itau{case['init_tau']}")
    if case.get("kind") in ("LIF", "PLIF"):
        parts.append("di" if case.get("decay_input", True) else "nodi")
    v_reset = case.get("v_reset", 0.0)
    parts.append("soft" if v_reset is None else f"hard{v_reset}")
    parts.append("detach" if case.get("detach_reset", False) else "nodetach")
    parts.append(str(case.get("surrogate", "sigmoid4")))
    parts.append(f"th{case.get('v_threshold', 1.0)}")
    return "-".join(parts)


# The modules that take longest (single-process CPU time with their child processes, ``/usr/bin/time``), longest
# first: collected first, and so handed out first by ``--dist loadscope --no-loadscope-reorder`` (pyproject.toml), so
# that the short modules fill the end of the run and the two workers finish together.
SLOW_MODULES = ("test_elastic.py", "test_neuron_impls.py", "test_pipeline.py", "test_train.py",
                "test_zoo_transformers_layouts.py", "test_zoo.py", "test_zoo_calls.py", "test_parallel_equivalence.py",
                "test_zoo_transformers.py", "test_launch.py", "test_faults.py", "test_zoo_layouts.py",
                "test_temporal_equivalence.py", "test_remat.py", "test_interop.py", "test_zoo_vgg.py",
                "test_weight_split.py", "test_docs.py", "test_notebooks.py", "test_temporal_plan.py",
                "test_neurons_sharded.py", "test_examples.py")


def pytest_collection_modifyitems(config, items):
    """Slow modules first (``SLOW_MODULES``), the others in their usual order."""
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each module's order kept


def pytest_generate_tests(metafunc):
    """Run every test that takes ``neuron_case`` once per case of ``neurons.json``."""
    if "neuron_case" in metafunc.fixturenames:
        cases = json.loads((REFERENCE_DIR / "neurons.json").read_text())
        metafunc.parametrize("neuron_case", range(len(cases)), indirect=True,
                             ids=[_case_id(i, c) for i, c in enumerate(cases)])


@pytest.fixture(scope="session")
def neuron_reference() -> tuple[list[dict], dict]:
    """``(cases of neurons.json, every array of neurons.npz)``, read once."""
    from snnjax.interop import check  # noqa: PLC0415 (jax is configured above; only reference tests need it)

    cases, arrays = check.load(REFERENCE_DIR / "neurons.npz")
    with arrays:
        return cases, dict(arrays)


@pytest.fixture
def neuron_case(request, neuron_reference) -> tuple[dict, dict]:
    """``(case, arrays)`` of one SpikingJelly neuron case; arrays are float64 ``[T, N, C]`` (PLIF's ``w`` a scalar)."""
    from snnjax.interop import check  # noqa: PLC0415 (as above)

    cases, arrays = neuron_reference
    i = request.param
    case_arrays = check.case_arrays(arrays, f"case{i:03d}/")
    missing = set(NEURON_ARRAYS) - set(case_arrays)
    assert not missing, f"case {i}: arrays {sorted(missing)} missing from neurons.npz"
    return cases[i], case_arrays


@contextlib.contextmanager
def jax_setting(name: str, value):
    """Set JAX config option ``name`` for a block and restore the previous setting."""
    previous = jax.config.read(name)
    jax.config.update(name, value)
    try:
        yield
    finally:
        jax.config.update(name, previous)


def x64_mode(enabled: bool):
    """``jax_enable_x64`` for a block (spikes need float64 to compare)."""
    return jax_setting("jax_enable_x64", enabled)


def quick_compiles():
    """``jax_disable_most_optimizations`` for a block: XLA:CPU without its expensive optimisations compiles the
    models' programs about twice as fast, computing the same values to rounding (far below every tolerance)."""
    return jax_setting("jax_disable_most_optimizations", True)


@pytest.fixture
def x64():
    with x64_mode(True):
        yield


@pytest.fixture(scope="module")
def x64_module():
    with x64_mode(True):
        yield


@pytest.fixture(scope="module")
def x32_module():
    with x64_mode(False):
        yield


@pytest.fixture(scope="module")
def quick_compiles_module():
    with quick_compiles():
        yield
