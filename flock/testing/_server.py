"""The fake kube-apiserver on a thread of its own, and kubeconfigs pointing at it.

In a test, :class:`ApiServer` runs the server on a thread with its own asyncio
loop; every public method is thread-safe and may be called from Trio.  See
:mod:`flock.testing.apiserver` for the command line the lab uses.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ._http import HttpFrontend
from ._resources import NODECONFIGS, PODS, SECRETS, Resource
from ._selectors import FieldSelector
from ._store import ObjectStore

T = TypeVar("T")


def kubeconfig(url: str, token: str = "flock-testing") -> dict[str, Any]:
    """A kubeconfig (JSON is YAML) that points a client at *url*."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "flock-testing", "cluster": {"server": url}}],
        "users": [{"name": "flock-testing", "user": {"token": token}}],
        "contexts": [{"name": "flock-testing", "context": {"cluster": "flock-testing", "user": "flock-testing"}}],
        "current-context": "flock-testing",
    }


def write_kubeconfig(path: str | os.PathLike[str], url: str) -> Path:
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(kubeconfig(url), indent=2) + "\n")
    os.replace(tmp, target)
    return target


@attrs.define(eq=False)
class ApiServer:
    """The fake API server on a thread of its own; a context manager.

    ``stop()`` then ``start()`` is a server restart: same port, same objects and
    history (etcd survives), every connection cut.
    """

    host: str = "127.0.0.1"
    port: int = 0
    bookmark_interval: float = 1.0
    store: ObjectStore = attrs.field(factory=ObjectStore)
    _frontend: HttpFrontend = attrs.field(init=False)
    _loop: asyncio.AbstractEventLoop | None = attrs.field(init=False, default=None)
    _thread: threading.Thread | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._frontend = HttpFrontend(self.store, self.host, self.port, self.bookmark_interval)

    # ---- lifecycle ------------------------------------------------------------

    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self._loop is None:
            made: list[asyncio.AbstractEventLoop] = []
            ready = threading.Event()

            def serve_loop() -> None:
                # A plain selector loop, made on this thread: trio-asyncio's
                # policy refuses new_event_loop() inside a Trio run.
                loop = asyncio.SelectorEventLoop()
                made.append(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._thread = threading.Thread(target=serve_loop, name="flock-testing-apiserver", daemon=True)
            self._thread.start()
            ready.wait()
            self._loop = made[0]
        self._run(self._frontend.start())

    def stop(self) -> None:
        """Stop serving (connections cut); objects stay for the next :meth:`start`."""
        if self._loop is not None:
            self._run(self._frontend.stop())

    def restart(self, *, empty: bool = False) -> None:
        """Stop and start again; *empty*: with a fresh store, as an API server
        whose etcd was wiped (resourceVersions start over)."""
        self.stop()
        if empty:
            self.store = ObjectStore(history_limit=self.store.history_limit)
            self._frontend.store = self.store
        self.start()

    def close(self) -> None:
        """Stop serving and end the thread."""
        if self._loop is None:
            return
        loop, thread = self._loop, self._thread
        self.stop()
        loop.call_soon_threadsafe(loop.stop)
        assert thread is not None
        thread.join()
        loop.close()
        self._loop = self._thread = None

    @property
    def url(self) -> str:
        return self._frontend.url

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path?query) of every API request so far (a copy)."""
        return self._call(lambda: list(self._frontend.requests))

    @property
    def open_requests(self) -> int:
        """Requests (watches included) the server is serving right now."""
        return self._call(lambda: self._frontend.open_requests)

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> Path:
        return write_kubeconfig(path, self.url)

    # ---- objects (straight to the store: thread-safe) ---------------------------

    def create(self, resource: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.store.create(resource, obj)

    def update(self, resource: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.store.update(resource, obj)

    def patch(
        self, resource: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """JSON merge patch, e.g. ``{"metadata": {"annotations": {"k": "v"}}}``."""
        return self.store.patch(resource, name, patch, namespace)

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.store.delete(resource, name, namespace)

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.store.get(resource, name, namespace)

    def list(self, resource: Resource, field_selector: str = "") -> list[dict[str, Any]]:
        items, _ = self.store.list(resource, None, FieldSelector.parse(field_selector, resource.kind))
        return [json.loads(json.dumps(o)) for o in items]

    # ---- faults ---------------------------------------------------------------

    def compact(self, *, expire_watches: bool = False) -> int:
        return self.store.compact(expire_watches=expire_watches)

    def drop_connections(self) -> int:
        return self._call(self._frontend.drop_connections)

    def fail_next(self, count: int, status: int = 500) -> None:
        self._call(lambda: self._frontend.fail_next(count, status))

    def pause(self) -> None:
        self._call(self._frontend.pause)

    def resume(self) -> None:
        self._call(self._frontend.resume)

    # ---- internals ------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None, "ApiServer is not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _call(self, fn: Any) -> Any:
        async def on_loop() -> Any:
            return fn()

        return self._run(on_loop())


def load_objects(store: ObjectStore, path: str | os.PathLike[str]) -> int:
    """Create the objects in a JSON file (a list, or a List object with ``items``); returns how many."""
    data = json.loads(Path(path).read_text())
    items = data.get("items", []) if isinstance(data, dict) else data
    by_kind = {r.kind: r for r in (PODS, NODECONFIGS, SECRETS)}
    for obj in items:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind not in by_kind:
            raise SystemExit(
                f"{os.fspath(path)}: cannot load object of kind {kind!r}: expected Pod, NodeConfig or Secret"
            )
        store.create(by_kind[kind], obj)
    return len(items)
