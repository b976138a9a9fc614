"""The import graph of ``snnjax`` is a tree of packages with one direction per dependency.

Built with grimp, which reads every import statement, function-local ones included, so an
import moved into a function to dodge a circle is still a circle here.
"""
from __future__ import annotations

import ast
import functools
import importlib
import json
import pathlib
import re

import grimp
import pytest


@functools.cache
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("snnjax")


def imported_by(package: str) -> set[str]:
    """Every snnjax module imported by a module of ``package`` (the package's own modules excluded)."""
    g = graph()
    found = set()
    for module in g.find_children(package) | g.find_descendants(package) | {package}:
        found |= g.find_modules_directly_imported_by(module)
    return {m for m in found if not (m == package or m.startswith(package + "."))}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    g = graph()
    edges = {m: g.find_modules_directly_imported_by(m) for m in g.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle():
    assert cycles() == []


KERNELS = "snnjax.neurons.kernels"


@pytest.mark.parametrize("package", [f"{KERNELS}.pallas", f"{KERNELS}.native", f"{KERNELS}.xla"])
def test_implementations_import_only_the_neuron_equations(package):
    allowed = {"snnjax", "snnjax.neurons", "snnjax.neurons.base", "snnjax.neurons.surrogate", KERNELS, "snnjax.cpp",
               "snnjax.cpp.build"}  # the last two: the shared C++ build
    assert imported_by(package) <= allowed


def test_only_the_dispatcher_imports_the_fused_kernels():
    g = graph()
    importers = set()
    for kernel in (f"{KERNELS}.pallas", f"{KERNELS}.native"):
        for module in g.find_descendants(kernel) | {kernel}:
            importers |= {m for m in g.find_modules_that_directly_import(module) if not m.startswith(kernel)}
    library = {m for m in importers if not m.startswith("snnjax.bench.")}  # benchmarks time the kernels directly
    assert library <= {f"{KERNELS}.dispatch", f"{KERNELS}.sharded"}


@pytest.mark.parametrize("package, forbidden", [
    ("snnjax.parallel", {"snnjax.train", "snnjax.models", "snnjax.layers", "snnjax.data", "snnjax.interop"}),
    ("snnjax.neurons", {"snnjax.parallel", "snnjax.train", "snnjax.models", "snnjax.layers", "snnjax.data"}),
    ("snnjax.models", {"snnjax.train", "snnjax.data", "snnjax.interop", "snnjax.bench"}),
    ("snnjax.layers", {"snnjax.train", "snnjax.models", "snnjax.data"}),
    ("snnjax.data", {"snnjax.train", "snnjax.parallel", "snnjax.models", "snnjax.neurons"}),
    ("snnjax.train", {"snnjax.bench", "snnjax.interop", "snnjax.deploy"}),
    ("snnjax.deploy", {"snnjax.bench", "snnjax.interop"}),
    ("snnjax.ann2snn", {"snnjax.bench", "snnjax.interop", "snnjax.deploy", "snnjax.runtime"}),
    ("snnjax.runtime", {"snnjax.train", "snnjax.models", "snnjax.layers", "snnjax.data", "snnjax.parallel",
                        "snnjax.deploy", "snnjax.interop", "snnjax.bench"}),
])
def test_dependencies_point_one_way(package, forbidden):
    bad = {m for m in imported_by(package) if any(m == f or m.startswith(f + ".") for f in forbidden)}
    assert not bad, f"{package} imports {sorted(bad)}"


ROOT = pathlib.Path(__file__).resolve().parents[1]


def public_modules() -> set[str]:
    """``snnjax``, its direct subpackages and modules that declare ``__all__``, and modules a public package lists
    in its ``__all__``: the names examples, notebooks and docs may import. Every other module is internal."""
    g = graph()
    public = {"snnjax"}
    for module in sorted(g.modules, key=lambda m: m.count(".")):
        parent, _, name = module.rpartition(".")
        if parent not in public or not hasattr(importlib.import_module(module), "__all__"):
            continue
        if parent == "snnjax" or name in importlib.import_module(parent).__all__:
            public.add(module)
    return public


def user_code() -> dict[str, str]:
    """The Python that users read and copy: examples (scripts, notebook cells) and the docs' code blocks."""
    found = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "examples").glob("*.py")}
    for nb in (ROOT / "examples").glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        found[str(nb.relative_to(ROOT))] = "\n".join(line for cell in code for line in cell.splitlines()
                                                      if not line.lstrip().startswith(("%", "!")))
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if md.exists():
            blocks = re.findall(r"```python[^\n]*\n(.*?)```", md.read_text(), flags=re.S)
            found[str(md.relative_to(ROOT))] = "\n".join(blocks)
    return found


def snnjax_names(code: str) -> list[tuple[str, str]]:
    """Every ``(module, name)`` the code takes from snnjax: ``from M import n``, ``import M``, ``snnjax.a.b``."""
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "snnjax":
            names += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            names += [tuple(a.name.rsplit(".", 1)) for a in node.names if a.name.startswith("snnjax.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "snnjax":
            names.append(("snnjax", node.attr))
    return names


@pytest.mark.parametrize("path", sorted(user_code()))
def test_user_code_imports_only_public_names(path):
    public = public_modules()
    bad = []
    for module, name in snnjax_names(user_code()[path]):
        if module not in public:
            bad.append(f"{module} (internal module)")
        elif name not in importlib.import_module(module).__all__ and f"{module}.{name}" not in public:
            bad.append(f"{module}.{name} (not in {module}.__all__)")
    assert not bad, f"{path} uses internal names: {sorted(set(bad))}"
