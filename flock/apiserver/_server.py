"""The fake kube-apiserver on a thread of its own, and kubeconfigs pointing at it.

In a test, :class:`ApiServer` runs the server on a thread with its own asyncio
loop; every public method is thread-safe and may be called from Trio.  See
:mod:`flock.apiserver` for the command line the lab uses.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ._http import HttpFrontend
from ._resources import RESOURCES, Resource
from ._selectors import FieldSelector
from ._service_alloc import DEFAULT_SERVICE_CLUSTER_IP_RANGE
from ._status import StatusError
from ._store import RESOURCE_VERSION_WAIT, NewObject, ObjectStore, prepare_new
from ._virtual import VirtualWatches

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


def write_kubeconfig(path: str | os.PathLike[str], url: str, token: str = "flock-testing") -> Path:
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(kubeconfig(url, token), indent=2) + "\n")
    os.replace(tmp, target)
    return target


@attrs.define(eq=False)
class ApiServer:
    """The fake API server on a thread of its own; a context manager.

    ``stop()`` then ``start()`` is a server restart: same port, same objects and
    history (etcd survives), every connection cut.  Lists and watches follow
    kube-apiserver 1.32's rules (see :class:`flock.apiserver._selectors.ListQuery`
    and ``WatchQuery``); *watch_list* False is a server with the WatchList feature
    gate off, *paged_cache_lists* one whose watch cache pages (1.33+).  *service_cluster_ip_range*
    is kube-apiserver's ``--service-cluster-ip-range`` (one CIDR or two, comma-separated) for the
    store made here (a *store* given has its own).
    """

    host: str = "127.0.0.1"
    port: int = 0
    bookmark_interval: float = 1.0
    service_cluster_ip_range: str = attrs.field(default=DEFAULT_SERVICE_CLUSTER_IP_RANGE, kw_only=True)
    store: ObjectStore = attrs.field(
        default=attrs.Factory(
            lambda self: ObjectStore(service_cluster_ip_range=self.service_cluster_ip_range), takes_self=True
        )
    )
    watch_list: bool = True  # the WatchList feature gate (see HttpFrontend)
    paged_cache_lists: bool = False  # lists at "0" honour limit (1.33's cache snapshots)
    resource_version_wait: float = RESOURCE_VERSION_WAIT  # the watch cache's wait for a future version
    tokens: frozenset[str] | None = None  # bearer tokens accepted (None: no check); see HttpFrontend
    # bound service account tokens: token → its node-name claim (NodeConfig status writes: own node only)
    token_nodes: Mapping[str, str] = attrs.field(factory=dict)
    _frontend: HttpFrontend = attrs.field(init=False)
    _loop: asyncio.AbstractEventLoop | None = attrs.field(init=False, default=None)
    _thread: threading.Thread | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._frontend = HttpFrontend(
            self.store,
            self.host,
            self.port,
            self.bookmark_interval,
            watch_list=self.watch_list,
            paged_cache_lists=self.paged_cache_lists,
            resource_version_wait=self.resource_version_wait,
            tokens=self.tokens,
            token_nodes=self.token_nodes,
        )

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
            self.store = ObjectStore(
                history_limit=self.store.history_limit, service_cluster_ip_range=self.store.service_cluster_ip_range
            )
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

    @property
    def virtual_watches(self) -> VirtualWatches:
        """The store's counted watches (see :mod:`flock.apiserver._virtual`); thread-safe."""
        return self.store.virtual_watches

    def initial_bytes(
        self, resource: Resource | str, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> tuple[int, int]:
        """(events, bytes) a WatchList started now with these selectors sends before its live events."""
        return self.store.virtual_watches.initial_bytes(resource, namespace, label_selector, field_selector)

    def watch_traffic(self) -> dict[str, Any]:
        """What ``GET /debug/flock/watches`` answers: each real watch's events and bytes, and totals."""
        return self._call(self._frontend.watch_ledger.report)

    def write_kubeconfig(self, path: str | os.PathLike[str], token: str = "flock-testing") -> Path:
        return write_kubeconfig(path, self.url, token)

    # ---- objects (straight to the store: thread-safe) ---------------------------

    def create(self, resource: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.store.create(resource, obj)

    def bulk_create(self, resource: Resource, objects: Iterable[dict[str, Any]]) -> int:
        """Many objects at once (taken over, not copied; see :meth:`ObjectStore.bulk_create`)."""
        return self.store.bulk_create(resource, objects)

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

    def set_status(self, resource: Resource, name: str, status: Any, namespace: str | None = None) -> dict[str, Any]:
        return self.store.set_status(resource, name, status, namespace)

    def list(self, resource: Resource, field_selector: str = "", label_selector: str = "") -> list[dict[str, Any]]:
        items, _ = self.store.list(resource, None, FieldSelector.parse(field_selector, resource.kind, label_selector))
        return items

    def uninstall(self, resource: Resource) -> int:
        """Delete *resource*'s CRD: its objects go, requests for it answer 404 (see :meth:`ObjectStore.uninstall`)."""
        return self.store.uninstall(resource)

    def install(self, resource: Resource) -> None:
        """Create *resource*'s CRD again: served, empty."""
        self.store.install(resource)

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


def load_objects(store: ObjectStore, path: str | os.PathLike[str], *, workers: int | None = None) -> int:
    """Create the objects in a file, in its order; returns how many.

    The file is JSON (a list, or a List object with ``items``) or JSON lines (one
    object a line, as a benchmark writes 150,000 pods).  JSON lines are read as they
    go, and decoded, admitted and encoded (:func:`prepare_new`) by *workers*
    processes (default: one a CPU, at most 8, for a file over 32 MiB; 1: here).
    A bad object ends the program (SystemExit), naming the file.
    """
    file = Path(path)
    if workers is None:
        workers = min(os.cpu_count() or 1, 8) if file.stat().st_size > _PARALLEL_BYTES else 1
    prepared: Iterator[tuple[str, NewObject]]
    if _is_json_lines(file):
        chunks = _line_chunks(file)
        prepared = _prepared_in_pool(chunks, workers) if workers > 1 else _flat(map(_prepare_lines, chunks))
    else:
        data = json.loads(file.read_bytes())
        items = data.get("items") or [] if isinstance(data, dict) else data
        prepared = _flat(_prepare_objects(items[i : i + _LOAD_BATCH]) for i in range(0, len(items), _LOAD_BATCH))
    by_kind = {r.kind: r for r in RESOURCES}
    count = 0
    try:
        for kind, group in itertools.groupby(prepared, key=lambda kind_obj: kind_obj[0]):
            count += store.create_prepared(by_kind[kind], (obj for _, obj in group))
    except (ValueError, StatusError) as exc:
        raise SystemExit(f"{os.fspath(path)}: {exc}") from None
    return count


_LOAD_BATCH = 1000
_PARALLEL_BYTES = 32 * 2**20


def _prepare_objects(objects: Iterable[Any]) -> list[tuple[str, NewObject]]:
    """(kind, prepared object) of each; a bad one → ValueError (it crosses processes)."""
    by_kind = {r.kind: r for r in RESOURCES}
    out = []
    for obj in objects:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind not in by_kind:
            raise ValueError(f"cannot load object of kind {kind!r}: expected one of {', '.join(by_kind)}")
        try:
            out.append((kind, prepare_new(by_kind[kind], obj)))
        except StatusError as err:
            raise ValueError(f"{err.code} {err.reason}: {err.message}") from None
    return out


def _prepare_lines(lines: list[bytes]) -> list[tuple[str, NewObject]]:
    return _prepare_objects(json.loads(line) for line in lines)


def _prepared_in_pool(chunks: Iterator[list[bytes]], workers: int) -> Iterator[tuple[str, NewObject]]:
    """_prepare_lines of each chunk on *workers* processes (spawned: this one may have threads),
    in order, a few chunks ahead."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: collections.deque[concurrent.futures.Future[list[tuple[str, NewObject]]]] = collections.deque()
        for chunk in chunks:
            pending.append(pool.submit(_prepare_lines, chunk))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()


def _flat(batches: Iterable[list[tuple[str, NewObject]]]) -> Iterator[tuple[str, NewObject]]:
    for batch in batches:
        yield from batch


def _is_json_lines(path: Path) -> bool:
    """Whether the file's first line is a whole object that is not a List."""
    with path.open("rb") as f:
        try:
            head = json.loads(f.readline())
        except ValueError:
            return False
    return isinstance(head, dict) and not str(head.get("kind", "")).endswith("List") and "items" not in head


def _line_chunks(path: Path) -> Iterator[list[bytes]]:
    with path.open("rb") as f:
        while chunk := [line for line in itertools.islice(f, _LOAD_BATCH) if line.strip()]:
            yield chunk
