"""The README and the pages in docs/: the site builds with no broken link, the README is a first read that links
every page, and every command or Python block says which test runs it (or why none does); the Python blocks marked
``title="run by tests/test_docs.py"`` run here, all in one fresh process on the 8 CPU devices the tests see."""
import json
import os
import pathlib
import re
import subprocess
import sys

from conftest import QUICK_COMPILES_ENV

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
RUN = "run by tests/test_docs.py"
FENCE = re.compile(r"^```(\w*)(.*)$")
TITLE = re.compile(r'title="([^"]*)"')
COMMAND_LANGS = {"python", "bash", "console", "sh", "shell"}


def blocks(path: pathlib.Path) -> list[dict]:
    """Fenced blocks of a Markdown file: ``lang``, ``title``, ``code``, ``line`` (1-based), ``after`` (the line
    before the fence)."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i
        i += 1
        while not lines[i].startswith("```"):
            i += 1
        title = TITLE.search(m.group(2))
        found.append({"lang": m.group(1), "title": title.group(1) if title else None, "line": start + 1,
                      "code": "\n".join(lines[start + 1:i]), "after": lines[start - 1] if start else ""})
        i += 1
    return found


def where(path: pathlib.Path, block: dict) -> str:
    return f"{path.relative_to(ROOT)}:{block['line']}"


def test_the_site_builds_strictly(tmp_path):
    """Broken links or anchors, pages missing from the nav, nav entries without a page: each fails the build."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "index.html").exists()


def test_the_readme_is_a_first_read_that_links_every_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "the README is a first read: move the detail to a page in docs/"
    unlinked = [p.name for p in PAGES if f"(docs/{p.name}" not in text]
    assert not unlinked, f"the README links no docs/{unlinked}"


def test_every_command_and_snippet_says_how_it_is_checked():
    problems = []
    for path in [README, *PAGES]:
        for block in blocks(path):
            if block["lang"] not in COMMAND_LANGS:
                continue  # printed output, tables of text
            title = block["title"] or ""
            if title == RUN:
                if block["lang"] != "python":
                    problems.append(f"{where(path, block)}: only Python blocks run here")
            elif title.startswith("checked by "):
                named = re.findall(r"tests/[\w/]+\.py", title)
                missing = [t for t in named if not (ROOT / t).exists()]
                if not named or missing:
                    problems.append(f"{where(path, block)}: name the test file that checks it ({missing or title!r})")
            elif title.startswith("not run by the tests"):
                if not re.match(r"not run by the tests[^:]*: \S", title):
                    problems.append(f"{where(path, block)}: say why it is not run")
            else:
                problems.append(f'{where(path, block)}: add title="{RUN}", "checked by tests/...", or '
                                '"not run by the tests: <why>"')
    assert not problems, "\n".join(problems)


def test_the_readme_quickstart_is_the_example_the_tests_run():
    (quickstart,) = [b for b in blocks(README) if b["lang"] == "python"]
    example = (ROOT / "examples" / "quickstart.py").read_text()
    body = example[example.index("import os"):].replace("  # noqa: E402", "").rstrip()
    assert quickstart["code"] == body, "keep the README's quickstart equal to examples/quickstart.py (less noqa)"


def runnable() -> list[tuple[str, str]]:
    return [(where(path, b), b["code"]) for path in PAGES for b in blocks(path) if b["title"] == RUN]


# Each block in its own namespace and working directory; one JAX start for all of them.
RUNNER = """
import json, os, sys, tempfile, traceback
failures = {}
for label, code in json.load(sys.stdin):
    os.chdir(tempfile.mkdtemp(prefix="snnjax-docs-"))
    try:
        exec(compile(code, label, "exec"), {"__name__": "__main__"})
    except BaseException:
        failures[label] = traceback.format_exc()[-3000:]
print("FAILURES " + json.dumps(failures))
"""


def run_blocks(snippets: list[tuple[str, str]]) -> None:
    result = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(snippets), capture_output=True,
                            text=True, timeout=600, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **QUICK_COMPILES_ENV})
    assert result.returncode == 0, result.stderr[-3000:]
    failures = json.loads(result.stdout.rsplit("FAILURES ", 1)[1])
    assert not failures, "\n\n".join(f"{label}:\n{tb}" for label, tb in failures.items())


def test_the_docs_python_blocks_run():
    snippets = runnable()
    assert len(snippets) >= 6, [label for label, _ in snippets]
    run_blocks(snippets)
