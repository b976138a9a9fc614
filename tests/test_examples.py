"""Every script in examples/ runs to the end on 8 host CPU devices and prints what it walks through."""
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import COMPILE_SPEED_FLAGS, QUICK_COMPILES_ENV

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
# What each example must print: regular expressions searched in its stdout (multiline).
EXPECTED = {
    "quickstart.py": [
        r"^\{'loss': \d\.\d+, 'accuracy': [\d.]+\}\n(.*\n)*\{'loss': \d\.\d+, 'accuracy': [\d.]+\}$",
    ],
    "sharding_walkthrough.py": [
        r"^8 devices: cpu$",
        r"^[\d,]+ parameters, \d+ neurons$",
        r"^plan: mode=fsdp_tp .* on fsdp=4 x tensor=2",
        r"^parameters as placed:$",
        r"^blocks\.0\.mlp\.fc1\.fc\.kernel: P\('fsdp', 'tensor'\) -> P\(None, 'fsdp'\)$",
        r"^parameter bytes per device: \d+ -> \d+$",
        r"^loss 2\.\d+$",  # ten classes at initialisation: cross-entropy near ln 10 = 2.30
        r"^per-device cost of one train step",
        r"^\s*all-gather\s+[1-9]\d*\s",  # FSDP gathers its parameters
        r"^\s*all-reduce\s+[1-9]\d*\s",  # tensor parallelism reduces partial sums
    ],
}


def test_every_example_has_expectations():
    assert EXAMPLES and set(EXAMPLES) == set(EXPECTED), "add the new example's expected output to EXPECTED"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(tmp_path, name):
    env = {**os.environ, "XLA_FLAGS": f"{COMPILE_SPEED_FLAGS} --xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu", **QUICK_COMPILES_ENV}
    result = subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    for pattern in EXPECTED[name]:
        assert re.search(pattern, result.stdout, re.MULTILINE), f"{name} printed nothing matching {pattern!r}"
