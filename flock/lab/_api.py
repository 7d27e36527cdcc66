"""The lab's client of its API server, which listens inside the fabric namespace."""

from __future__ import annotations

import builtins
import json
from typing import Any

import attrs
import trio

from flock.apiserver import Resource
from flock.lab._nsio import http_in


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        self.status = status
        try:
            message = json.loads(body).get("message", body.decode(errors="replace"))
        except ValueError:
            message = body.decode(errors="replace")
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


@attrs.frozen
class ApiClient:
    netns: str
    host: str
    port: int

    def _path(self, res: Resource, namespace: str | None, name: str | None = None) -> str:
        path = f"{res.prefix}/namespaces/{namespace}/{res.plural}" if res.namespaced else f"{res.prefix}/{res.plural}"
        return path if name is None else f"{path}/{name}"

    async def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        status, data = await trio.to_thread.run_sync(
            http_in, self.netns, self.host, self.port, method, path, body, 5.0, content_type
        )
        if status >= 300:
            raise ApiError(method, path, status, data)
        return json.loads(data)

    async def version(self) -> dict[str, Any]:
        return await self._call("GET", "/version")

    async def create(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", self._path(res, obj["metadata"].get("namespace")), obj)

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self._call("GET", self._path(res, namespace, name))

    async def update(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT the whole object (status included, as the fake API server keeps it)."""
        meta = obj["metadata"]
        return await self._call("PUT", self._path(res, meta.get("namespace"), meta["name"]), obj)

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, grace_period_seconds: int | None = None
    ) -> dict[str, Any]:
        """DELETE; *grace_period_seconds* None: the object's own (a bound Pod is then only marked
        terminating, see :mod:`flock.apiserver._deletion`), 0: removed at once."""
        query = "" if grace_period_seconds is None else f"?gracePeriodSeconds={grace_period_seconds}"
        return await self._call("DELETE", self._path(res, namespace, name) + query)

    async def list(self, res: Resource) -> list[dict[str, Any]]:
        path = f"{res.prefix}/{res.plural}"
        return (await self._call("GET", path))["items"]

    async def replace(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self._call("PUT", self._path(res, meta.get("namespace"), meta["name"]), obj)

    async def patch(
        self, res: Resource, name: str, patch: dict[str, Any], namespace: str | None = None, subresource: str = ""
    ) -> dict[str, Any]:
        """A JSON merge patch (``subresource="status"``: the status only, as the kubelet writes it)."""
        path = self._path(res, namespace, name) + (f"/{subresource}" if subresource else "")
        return await self._call("PATCH", path, patch, "application/merge-patch+json")

    async def list_with_version(self, res: Resource) -> tuple[builtins.list[dict[str, Any]], int]:
        """Every object of *res* and the list's resourceVersion (the API server's newest)."""
        body = await self._call("GET", f"{res.prefix}/{res.plural}")
        return body["items"], int(body["metadata"]["resourceVersion"])
