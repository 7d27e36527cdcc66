"""Kubernetes ``Status`` objects: what the API server answers instead of an object.

The messages of the list and watch errors are kube-apiserver's own (1.32):
``storage/etcd3/errors.go`` (expired lists and continue tokens),
``storage/errors.go`` (too large resource version), ``storage/cacher``
(too old resource version of a watch) and ``apimachinery``'s ``NewInvalid``
of a ``ListOptions`` (the request validation in
``apis/meta/internalversion/validation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

EXPIRED_LIST = "The resourceVersion for the provided list is too old."
# A continue token whose resourceVersion is compacted away; the 410 carries a token for the rest
# of the list at the latest version (resourceVersion -1 in the token).
INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
    "that were created, modified, or deleted between the time the first chunk was returned and now may show "
    "up in the list."
)


class StatusError(Exception):
    """A request the server refuses; carries the Status object it answers with."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        list_meta: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details
        self.list_meta = list_meta  # the Status's ``metadata`` (a continue token)

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.message, self.reason, self.details, self.list_meta)


def status_object(
    code: int,
    message: str,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
    list_meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": dict(list_meta or {}),
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details:
        obj["details"] = details
    return obj


def expired(resource_version: int | str, oldest: int) -> StatusError:
    """A watch from a version older than the watch cache's window (the cacher's message)."""
    return StatusError(410, f"too old resource version: {resource_version} ({oldest})", reason="Expired")


def expired_list() -> StatusError:
    """An exact list at a compacted version (etcd's ErrCompacted)."""
    return StatusError(410, EXPIRED_LIST, reason="Expired")


def inconsistent_continue(token: str) -> StatusError:
    """A continue token at a compacted version: 410, with *token* (the rest at the latest version)."""
    return StatusError(410, INCONSISTENT_CONTINUE, reason="Expired", list_meta={"continue": token})


def too_large(resource_version: int, current: int, retry_after_seconds: int = 0) -> StatusError:
    """``storage.NewTooLargeResourceVersionError``: a 504 Timeout whose cause says why.

    The watch cache answers it after waiting for the version (retry after 1 s), etcd at once.
    """
    details: dict[str, Any] = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
    }
    if retry_after_seconds:
        details["retryAfterSeconds"] = retry_after_seconds
    return StatusError(
        504,
        f"Timeout: Too large resource version: {resource_version}, current: {current}",
        reason="Timeout",
        details=details,
    )


class Invalid(Exception):
    """One field of an object is wrong (admission): *field* is its path, *why* what is expected."""

    def __init__(self, field: str, value: Any, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field, self.value, self.why = field, value, why


@attrs.frozen
class FieldError:
    """One ``field.Error`` of a request's validation: Forbidden (with *detail*) or NotSupported
    (the *value* given and the *supported* ones)."""

    field: str
    type: str  # "Forbidden" or "NotSupported"
    detail: str = ""
    value: str = ""
    supported: tuple[str, ...] = ()

    @classmethod
    def forbidden(cls, field: str, detail: str) -> FieldError:
        return cls(field, "Forbidden", detail=detail)

    @classmethod
    def not_supported(cls, field: str, value: str, supported: Sequence[str]) -> FieldError:
        return cls(field, "NotSupported", value=value, supported=tuple(supported))

    @property
    def body(self) -> str:
        """What follows the field name (the cause's message)."""
        if self.type == "Forbidden":
            return f"Forbidden: {self.detail}"
        quoted = ", ".join(f'"{v}"' for v in self.supported)
        return f'Unsupported value: "{self.value}": supported values: {quoted}'

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


def invalid_list_options(errors: Sequence[FieldError]) -> StatusError:
    """``errors.NewInvalid(meta.k8s.io/ListOptions, "", errs)``, as the list handler answers."""
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    causes = [
        {
            "reason": "FieldValueForbidden" if e.type == "Forbidden" else "FieldValueNotSupported",
            "message": e.body,
            "field": e.field,
        }
        for e in errors
    ]
    return StatusError(
        422,
        f'ListOptions.meta.k8s.io "" is invalid: {listed}',
        reason="Invalid",
        details={"group": "meta.k8s.io", "kind": "ListOptions", "causes": causes},
    )
