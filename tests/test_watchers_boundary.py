"""The asyncio world stays inside flock/watchers and flock/testing (DESIGN, issue 4)."""

from __future__ import annotations

import ast
from pathlib import Path

import flock

ASYNCIO_WORLD = {"asyncio", "aiohttp", "kubernetes_asyncio", "trio_asyncio"}
ALLOWED = {"watchers", "testing"}


def test_no_asyncio_imports_outside_watchers_and_testing() -> None:
    root = Path(flock.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names if n.split(".")[0] in ASYNCIO_WORLD]
    assert offenders == []
