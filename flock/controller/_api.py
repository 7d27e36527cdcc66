"""What the controller needs of the API server (:class:`ObjectApi`), and two clients of it: :class:`KubeApi`
(kubernetes-asyncio's, as the agent's: in-cluster service account or a kubeconfig — TLS, tokens, client
certificates, exec plugins, the token re-read as it rotates) and :class:`HttpApi` (plain HTTP, no
credentials: the lab's and tests' API server).

Every write carries the object's ``resourceVersion``; a stale one is refused
with :class:`Conflict` (409) and the caller re-reads: that, not the Lease, is
what keeps two writers from giving one address twice.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any, Protocol

import attrs
import trio

from flock.watchers import KubeApiError, KubeClient, TransientKubeError


@attrs.frozen
class Kind:
    prefix: str  # /api/v1, /apis/<group>/<version>
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        base = f"{self.prefix}/namespaces/{namespace}/{self.plural}" if namespace else f"{self.prefix}/{self.plural}"
        if name is not None:
            base += f"/{name}"
        return base + (f"/{subresource}" if subresource else "")


SERVICES = Kind("/api/v1", "services", True)
NAMESPACES = Kind("/api/v1", "namespaces", False)
POOLS = Kind("/apis/flock.fritzlab.net/v1alpha1", "loadbalancerpools", False)
LEASES = Kind("/apis/coordination.k8s.io/v1", "leases", True)
EVENTS = Kind("/api/v1", "events", True)


class ApiRefused(RuntimeError):
    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status


class Conflict(ApiRefused):
    """409: the object changed since it was read (or exists already)."""


class NotFound(ApiRefused):
    """404."""


class ObjectApi(Protocol):
    async def list(self, kind: Kind) -> list[dict[str, Any]]: ...

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def replace(self, kind: Kind, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        """PUT *obj* (``status=True``: its /status subresource), guarded by its resourceVersion."""
        ...

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]: ...


class _Verbs:
    """:class:`ObjectApi`'s five verbs over one ``_run(method, path, body)`` (the clients below)."""

    async def _run(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        raise NotImplementedError

    async def list(self, kind: Kind) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self._run("GET", kind.path()))["items"]
        return items

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self._run("GET", kind.path(namespace, name))

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._run("POST", kind.path(obj["metadata"].get("namespace")), obj)

    async def replace(self, kind: Kind, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self._run("PUT", kind.path(meta.get("namespace"), meta["name"], "status" if status else ""), obj)

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self._run("DELETE", kind.path(namespace, name))


@attrs.frozen
class HttpApi(_Verbs):
    """The API server over plain HTTP (the lab's, tests'); no credentials."""

    url: str  # http://[2001:db8::1]:6443
    io_timeout: float = 5.0

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        parts = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=self.io_timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status >= 300:
            try:
                message = str(json.loads(data).get("message", ""))
            except ValueError:
                message = data.decode(errors="replace")
            error = {409: Conflict, 404: NotFound}.get(resp.status, ApiRefused)
            raise error(method, path, resp.status, message)
        answer: dict[str, Any] = json.loads(data)
        return answer

    async def _run(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        return await trio.to_thread.run_sync(self._call, method, path, body, abandon_on_cancel=True)


@attrs.frozen
class KubeApi(_Verbs):
    """The API server through kubernetes-asyncio's ApiClient (a :class:`flock.watchers.KubeClient`,
    which carries the configuration and the asyncio bridge); objects as plain dicts."""

    client: KubeClient
    io_timeout: float = 10.0

    async def _run(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        try:
            return await self.client.request(method, path, body, self.io_timeout)
        except KubeApiError as exc:
            error = {409: Conflict, 404: NotFound}.get(exc.status, ApiRefused)
            raise error(method, path, exc.status, str(exc)[:500]) from None
        except TransientKubeError as exc:
            raise OSError(str(exc)[:500]) from None
