"""What can go wrong talking to the API server, in flock's own terms.

The client stack's exceptions (``ApiException``, aiohttp's ``ClientError``
family, asyncio timeouts) are translated at the one place that calls it
(:mod:`flock.watchers._source`), so the informer and its tests never see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KubeError(Exception):
    """A request to the API server failed."""


class TransientKubeError(KubeError):
    """Worth retrying with backoff: connection refused/reset/cut, a stalled
    request, 429 or 5xx."""


class ResourceExpired(KubeError):
    """410 Gone: the resourceVersion we resume from is no longer kept; relist."""


class ResourceVersionTooLarge(ResourceExpired):
    """504 "Too large resource version": the server's history is behind ours
    (it restarted empty or was restored); relist, as client-go does."""


class KubeApiError(KubeError):
    """The server refused the request for a reason retrying will not fix
    (401, 403, 404 of a collection, 422, …)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{status} {reason}: {message}")


def error_for_status(status: int, body: Mapping[str, Any] | None) -> KubeError:
    """The exception for an HTTP error status and its Status object (if any)."""
    body = body or {}
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or "")
    if status == 410:
        return ResourceExpired(f"410 {reason or 'Gone'}: {message}")
    details = body.get("details")
    causes = details.get("causes") or [] if isinstance(details, Mapping) else []
    if status == 504 and (
        message.startswith("Too large resource version")
        or any(isinstance(c, Mapping) and c.get("reason") == "ResourceVersionTooLarge" for c in causes)
    ):
        return ResourceVersionTooLarge(f"504 {reason}: {message}")
    if status == 429 or status >= 500:
        return TransientKubeError(f"{status} {reason}: {message}")
    return KubeApiError(status, reason, message)
