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

import gc
import importlib
import importlib.util
import logging
import os
import re
import sys
from typing import Any, NoReturn

# Parents first.
LAZY_PACKAGES = (
    "pyroute2",
    "kubernetes_asyncio",
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.client.api",
    "kubernetes_asyncio.client.models",
    # kubernetes_asyncio's Configuration imports it for basic auth alone (aiohttp does the HTTP).
    "urllib3",
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
            # A submodule the __init__ imports relatively (``from . import util``).
            if importlib.util.find_spec(f"{name}.{attr}") is None:
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            value = importlib.import_module(f"{name}.{attr}")
            setattr(module, attr, value)
            return value
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
    """``flock-agent``: the agent, then a prompt exit (see :func:`exit_now`).

    The cyclic garbage collector is off from here until the agent is ready
    (``flock.agent._startup`` hands it back): start-up's objects all live on."""
    gc.disable()
    lazy_packages()
    from flock.agent._main import main

    try:
        main()
    except SystemExit as exc:
        exit_now(exc.code)
    exit_now(0)


def exit_now(code: int | str | None) -> NoReturn:
    """Exit with *code* as ``sys.exit`` would, without tearing the interpreter down.

    When the agent returns, its tree has stopped: every task ended, the store
    closed, no worker thread left running (none is abandoned).  What an
    ordinary exit adds is the interpreter's teardown (every module and object
    freed: ~0.1 s for the agent's ~700 modules), while the kubelet waits to
    start the next agent: a restart's downtime.  Output is flushed first.
    """
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)
