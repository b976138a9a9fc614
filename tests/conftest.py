"""Test configuration: 8 host CPU devices, set before jax is imported anywhere."""
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# threefry compiles slowly on XLA:CPU (about 3 s per new parameter shape on the CI machine); the
# RngBitGenerator-based PRNG compiles in a tenth of that. Tests never depend on specific random bits.
os.environ.setdefault("JAX_DEFAULT_PRNG_IMPL", "rbg")

import contextlib  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

REFERENCE_DIR = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> pathlib.Path:
    """The SpikingJelly golden data folder (``../shared/reference`` beside the checkout)."""
    if not (REFERENCE_DIR / "neurons.npz").exists():
        pytest.fail(f"SpikingJelly reference data not found at {REFERENCE_DIR}")
    return REFERENCE_DIR


@contextlib.contextmanager
def x64_mode(enabled: bool):
    """Set ``jax_enable_x64`` for a block and restore the previous setting (spikes need float64 to compare)."""
    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", enabled)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


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
