"""The asyncio world stays inside flock/watchers, the lab's API server (flock/apiserver) and flock/testing
(DESIGN, issue 4)."""

from __future__ import annotations

import ast
from pathlib import Path

import flock

ASYNCIO_WORLD = {"asyncio", "aiohttp", "kubernetes_asyncio", "trio_asyncio"}
ALLOWED = {"watchers", "apiserver", "testing"}
# pyroute2 0.9 is asyncio underneath; flock.netlink drives its AsyncIPRoute in
# a private loop on a worker thread (never on the Trio thread). That is the
# netlink library's runtime, not the Kubernetes client, so only plain asyncio.
ALLOWED_FILES = {"netlink/_conn.py": {"asyncio"}}


def test_no_asyncio_imports_outside_watchers_apiserver_and_testing() -> None:
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
            rel = path.relative_to(root).as_posix()
            allowed = ALLOWED_FILES.get(rel, set())
            offenders += [f"{rel}:{node.lineno} {n}" for n in names if n.split(".")[0] in ASYNCIO_WORLD - allowed]
    assert offenders == []
