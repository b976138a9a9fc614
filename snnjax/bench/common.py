"""Helpers the benchmark CLIs share (no jax import here: CLIs may set XLA flags after importing this)."""
from __future__ import annotations

import json
import os
import subprocess


def git_commit() -> str | None:
    """The repository's HEAD commit, with ``-dirty`` if tracked files changed; None outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "-uno"], capture_output=True, text=True)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def append_jsonl(path: str | None, record: dict) -> None:
    """Append ``record`` as one JSON line to ``path`` (nothing when ``path`` is None)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
