"""The built-in pair's corpus: the running interpreter's standard library, split by a stable hash of
each file's path into a training split and a held-out split (the workloads come only from the
held-out one), plus documents in the workloads' task formats built from training files only."""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from pathlib import Path

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "dist-packages"}


def stdlib_files() -> list[tuple[str, Path]]:
    """Every standard-library ``.py`` file outside test folders, as (relative path, path), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        out.append((rel.as_posix(), path))
    return out


def is_held_out(rel: str) -> bool:
    """1 file in 10, chosen by a stable hash of its relative path."""
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 10 == 0


def split_files(held_out: bool, files: list[tuple[str, Path]] | None = None) -> list[tuple[str, str, ast.AST | None]]:
    """(relative path, text, parsed tree or None) of one split's readable files (of ``files``, by
    default the whole standard library), in the given order."""
    out = []
    for rel, path in stdlib_files() if files is None else files:
        if is_held_out(rel) != held_out:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            tree = None
        out.append((rel, text, tree))
    return out
