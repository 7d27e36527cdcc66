"""``flock-agent``'s console script: the agent, with its two big libraries imported lazily.

``import pyroute2`` and ``import kubernetes_asyncio.client`` each run a package
``__init__`` that imports everything the library has (every netlink family,
IPDB and NDB; every API group and ~700 models): about 35 MiB of resident
memory and half the agent's import time, for the dozen names flock uses.
:func:`lazy_packages` registers those packages without running their
``__init__``: a name is imported from the submodule the ``__init__`` names
for it on first use (PEP 562 module ``__getattr__``), and submodules import
as usual.  Only the agent process does this (tests and tools that import
flock get the libraries as they are), and it must happen before anything
imports them, so this module lives outside :mod:`flock.agent`.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from typing import Any

# Parents first.
LAZY_PACKAGES = (
    "pyroute2",
    "kubernetes_asyncio",
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.client.api",
    "kubernetes_asyncio.client.models",
)
_FROM_IMPORT = re.compile(r"^from ([\w.]+) import (?:\(([^)]*)\)|([^\n#]*))", re.M)


def lazy_package(name: str) -> None:
    """Register package *name* unexecuted; its attributes resolve from its
    ``__init__``'s top-level ``from X import Y`` lines when first read.
    Does nothing when it is already imported or cannot be found."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or spec.loader is None:
        return
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    where: dict[str, str] = {}
    for m in _FROM_IMPORT.finditer(source):
        for attr in re.split(r"[,\s]+", m.group(2) or m.group(3) or ""):
            if attr and attr.isidentifier():
                where.setdefault(attr, m.group(1))
    module = importlib.util.module_from_spec(spec)

    def __getattr__(attr: str) -> Any:
        origin = where.get(attr)
        if origin is None:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(origin), attr)
        setattr(module, attr, value)
        return value

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)


def lazy_packages() -> None:
    for name in LAZY_PACKAGES:
        lazy_package(name)


def agent() -> None:
    """``flock-agent``."""
    lazy_packages()
    from flock.agent._main import main

    main()
