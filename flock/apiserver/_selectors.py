"""What a list or watch request selects, parsed and checked as kube-apiserver does.

Field selectors (for the fields flock filters on), with the request's label
selector (:mod:`._labels`) alongside; a list's and a watch's
options (``resourceVersion``, ``resourceVersionMatch``, ``limit``,
``continue``, ``sendInitialEvents``, ``allowWatchBookmarks``), validated by the
rules of ``apimachinery/pkg/apis/meta/internalversion/validation`` (1.32) and
defaulted by its ``SetListOptionsDefaults``; and the continue token of
``apiserver/pkg/storage/continue.go``.
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._labels import EVERYTHING, Labels, LabelSelector, LabelSelectorError
from ._status import FieldError, StatusError, invalid_list_options

# Per resource kind, the fields kube-apiserver accepts in a fieldSelector.
SUPPORTED_FIELDS = {
    "Pod": ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"),
    "NodeConfig": ("metadata.name", "metadata.namespace"),
    "Namespace": ("metadata.name", "metadata.namespace", "status.phase"),
    "NetworkPolicy": ("metadata.name", "metadata.namespace"),
    "Secret": ("metadata.name", "metadata.namespace", "type"),
    "ClusterNetworkPolicy": ("metadata.name", "metadata.namespace"),  # a custom resource's two
    "Node": ("metadata.name",),
    "Service": ("metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"),
    "EndpointSlice": ("metadata.name", "metadata.namespace"),
    # flock's own custom resources: the two every custom resource has
    "LoadBalancerPool": ("metadata.name", "metadata.namespace"),
    "AddressGroup": ("metadata.name", "metadata.namespace"),
    "NodeAddressGroups": ("metadata.name", "metadata.namespace"),
    # what kubectl describe asks for an object's events by
    "Event": (
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),  # (and spec.unschedulable, which nothing here selects by)
    # deploy/'s other kinds (kubectl delete's wait watches by metadata.name)
    **{
        kind: ("metadata.name", "metadata.namespace")
        for kind in (
            "CustomResourceDefinition",
            "ServiceAccount",
            "ConfigMap",
            "DaemonSet",
            "Deployment",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        )
    },
}

EXACT, NOT_OLDER_THAN = "Exact", "NotOlderThan"
# The annotation on the BOOKMARK that ends a WatchList's initial events (KEP-3157).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_CONTINUE_VERSION = "meta.k8s.io/v1"
_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # Go's strconv.ParseBool
_FALSE = ("0", "f", "F", "FALSE", "false", "False")

FieldValues = tuple[str, ...]  # an object's values of its kind's SUPPORTED_FIELDS, in that order


@attrs.frozen
class Requirement:
    field: str
    value: str
    equal: bool


@attrs.frozen
class FieldSelector:
    """A request's field selector and, in *labels*, its label selector: an object is
    selected when it meets both."""

    requirements: tuple[Requirement, ...] = ()
    labels: LabelSelector = EVERYTHING

    @classmethod
    def parse(cls, text: str | None, kind: str, labels: str | None = None) -> FieldSelector:
        """Parse ``a=b,c==d,e!=f`` (and the label selector *labels*, see :mod:`._labels`);
        unsupported fields or syntax → 400 like the real server."""
        try:
            label_selector = LabelSelector.parse(labels)
        except LabelSelectorError as err:
            raise StatusError(400, str(err)) from None
        if not text:
            return cls(labels=label_selector)
        reqs = []
        for term in text.split(","):
            if "!=" in term:
                field, value = term.split("!=", 1)
                equal = False
            elif "==" in term:
                field, value = term.split("==", 1)
                equal = True
            elif "=" in term:
                field, value = term.split("=", 1)
                equal = True
            else:
                raise StatusError(400, f"invalid field selector: {text!r}: term {term!r} has no operator")
            field = field.strip()
            if field not in SUPPORTED_FIELDS.get(kind, ()):
                raise StatusError(400, f'field label not supported: "{field}"')
            reqs.append(Requirement(field, value.strip(), equal))
        return cls(tuple(reqs), label_selector)

    @property
    def empty(self) -> bool:
        return not self.requirements and self.labels.empty

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return self.labels.matches(labels) and all(
            (field_value(obj, r.field) == r.value) == r.equal for r in self.requirements
        )

    def matcher(self, kind: str) -> Callable[[FieldValues, Labels], bool]:
        """A test of an object's :func:`field_values` and labels (no decoding)."""
        fields = SUPPORTED_FIELDS.get(kind, ())
        checks = tuple((fields.index(r.field), r.value, r.equal) for r in self.requirements)
        labels = self.labels
        if not checks and labels.empty:
            return _everything
        if labels.empty:
            return lambda values, _: all((values[i] == value) == equal for i, value, equal in checks)
        return lambda values, found: (
            labels.matches(found) and all((values[i] == value) == equal for i, value, equal in checks)
        )

    def required(self, field: str) -> str | None:
        """The value an equality requirement demands of *field* (an index can serve it), if any."""
        for r in self.requirements:
            if r.field == field and r.equal:
                return r.value
        return None


def _everything(values: FieldValues, labels: Labels) -> bool:
    return True


def field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return "" if cur is None else str(cur)


def field_values(obj: Mapping[str, Any], kind: str) -> FieldValues:
    """*obj*'s values of the fields its kind can be selected by; the shared ones interned."""
    return tuple(
        value if field == "metadata.name" else sys.intern(value)
        for field in SUPPORTED_FIELDS.get(kind, ())
        for value in (field_value(obj, field),)
    )


def parse_bool(name: str, text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise StatusError(400, f'invalid value for {name}: strconv.ParseBool: parsing "{text}": invalid syntax')


def parse_resource_version(text: str) -> int:
    """A resourceVersion given as a number ("" is 0); anything else → 400."""
    if not text:
        return 0
    if not text.isdigit():
        raise StatusError(400, f'invalid resource version: invalid resource version "{text}"')
    return int(text)


# ---- lists ---------------------------------------------------------------------


@attrs.frozen
class ListQuery:
    """A list request's options (``metav1.ListOptions`` besides selectors and watch)."""

    resource_version: str = ""
    resource_version_match: str = ""
    limit: int = 0
    continue_: str = ""
    send_initial_events: bool | None = None  # refused on a list; kept to say so

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> ListQuery:
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise StatusError(400, f"invalid limit {query['limit']!r}: expected an integer") from None
        sie = query.get("sendInitialEvents")
        return cls(
            query.get("resourceVersion", ""),
            query.get("resourceVersionMatch", ""),
            limit,
            query.get("continue", ""),
            None if sie is None else parse_bool("sendInitialEvents", sie),
        )

    def validate(self) -> None:
        """``ValidateListOptions`` for a list: 422 Invalid naming every problem."""
        errors = []
        match = self.resource_version_match
        if match:
            if not self.resource_version:
                errors.append(
                    FieldError.forbidden(
                        "resourceVersionMatch", "resourceVersionMatch is forbidden unless resourceVersion is provided"
                    )
                )
            if self.continue_:
                errors.append(
                    FieldError.forbidden(
                        "resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"
                    )
                )
            if match not in (EXACT, NOT_OLDER_THAN):
                errors.append(FieldError.not_supported("resourceVersionMatch", match, (EXACT, NOT_OLDER_THAN, "")))
            if match == EXACT and self.resource_version == "0":
                errors.append(
                    FieldError.forbidden(
                        "resourceVersionMatch", 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
                    )
                )
        if self.send_initial_events is not None:
            errors.append(FieldError.forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
        if errors:
            raise invalid_list_options(errors)

    def plan(self, *, paged_cache_lists: bool = False) -> ListPlan:
        """Validate, then say which version answers and how, as kube-apiserver 1.32's
        ``cacher.shouldDelegateList`` and ``storage.ValidateListOptions`` decide.

        etcd answers a continue (at the token's version: exact), an Exact match, a limited
        list at "" (the latest, paged) or at N (no match: the legacy exact read at N; NotOlderThan:
        the latest, which must be at least N).  The watch cache answers the rest, whole: at ""
        (a consistent read), "0" (any version) or N (not older than N, waited for): a limit there
        is ignored (``hasLimit := pred.Limit > 0 && resourceVersion != "0"``) unless
        *paged_cache_lists* (1.33's snapshots of the cache page those too).
        """
        self.validate()
        limit = max(self.limit, 0)
        if self.continue_:
            rv, start = decode_continue(self.continue_)
            if self.resource_version not in ("", "0"):
                raise StatusError(400, "specifying resource version is not allowed when using continue")
            return ListPlan(at=rv if rv > 0 else None, limit=limit, start=start, continued=True)
        rv = parse_resource_version(self.resource_version)
        match = self.resource_version_match
        if match == EXACT:
            return ListPlan(at=rv, limit=limit)
        if not self.resource_version:
            return ListPlan(limit=limit, from_cache=not limit)
        if limit and self.resource_version != "0":
            return ListPlan(at=None if match else rv, minimum=rv if match else 0, limit=limit)
        return ListPlan(minimum=rv, from_cache=True, limit=limit if paged_cache_lists else 0)


@attrs.frozen
class ListPlan:
    """How a list is answered: at version *at* exactly (None: the latest, which must be at least
    *minimum*), from key *start* (relative to the list's key prefix) on, *limit* items (0: all).
    *from_cache*: the watch cache answers, after waiting for *minimum*; *continued*: a continue
    token's page (a compacted version answers the inconsistent-continue 410)."""

    at: int | None = None
    minimum: int = 0
    limit: int = 0
    start: str = ""
    from_cache: bool = False
    continued: bool = False


# ---- watches -------------------------------------------------------------------


@attrs.frozen
class WatchQuery:
    """A watch request's options."""

    resource_version: str = ""
    resource_version_match: str = ""
    send_initial_events: bool | None = None
    allow_bookmarks: bool = False
    continue_: str = ""

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> WatchQuery:
        sie = query.get("sendInitialEvents")
        return cls(
            query.get("resourceVersion", ""),
            query.get("resourceVersionMatch", ""),
            None if sie is None else parse_bool("sendInitialEvents", sie),
            parse_bool("allowWatchBookmarks", query.get("allowWatchBookmarks") or "false"),
            query.get("continue", ""),
        )

    def checked(self, watch_list: bool) -> WatchQuery:
        """Defaulted and validated as the list handler does with the WatchList feature gate
        *watch_list*: a watch from "" or "0" is a WatchList when the gate is on; 422 when invalid."""
        query = self
        if (
            watch_list
            and query.send_initial_events is None
            and not query.resource_version_match
            and query.resource_version in ("", "0")
        ):
            query = attrs.evolve(query, send_initial_events=True, resource_version_match=NOT_OLDER_THAN)
        errors = []
        match = query.resource_version_match
        if query.send_initial_events is not None:
            if match != NOT_OLDER_THAN:
                errors.append(
                    FieldError.forbidden(
                        "resourceVersionMatch",
                        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    )
                )
            if not watch_list:
                errors.append(
                    FieldError.forbidden(
                        "sendInitialEvents",
                        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                    )
                )
        if match:
            if query.send_initial_events is None:
                errors.append(
                    FieldError.forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    )
                )
            if match != NOT_OLDER_THAN:
                errors.append(FieldError.not_supported("resourceVersionMatch", match, (NOT_OLDER_THAN,)))
            if query.continue_:
                errors.append(
                    FieldError.forbidden(
                        "resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"
                    )
                )
        if errors:
            raise invalid_list_options(errors)
        return query

    @property
    def initial_events(self) -> bool:
        """ADDED events for the objects at the start: asked for, or the legacy watch from "" or "0"."""
        if self.send_initial_events is not None:
            return self.send_initial_events
        return self.resource_version in ("", "0")

    @property
    def minimum(self) -> int:
        """The version the watch needs: a WatchList's state is not older than it (the watch
        cache waits for it), a watch's events follow it."""
        return parse_resource_version(self.resource_version)

    @property
    def from_now(self) -> bool:
        """The watch starts at the current version (no replay of history)."""
        return self.resource_version in ("", "0")

    @property
    def end_bookmark(self) -> bool:
        """The initial events end with an annotated BOOKMARK (the cacher's ``isListWatchRequest``)."""
        return bool(self.send_initial_events) and self.allow_bookmarks


# ---- continue tokens -------------------------------------------------------------


def encode_continue(resource_version: int, start: str) -> str:
    """The token for the rest of a list from key *start* (relative to the list's key prefix) at
    *resource_version* (-1: at the latest), as ``storage.EncodeContinue`` makes it."""
    body = json.dumps({"v": _CONTINUE_VERSION, "rv": resource_version, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    """(resourceVersion, start key) of a token; a malformed one → 400 as the real server."""

    def bad(why: str) -> StatusError:
        return StatusError(400, f"invalid continue token: continue key is not valid{why}")

    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        body = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise bad(f": {exc}") from None
    if not isinstance(body, dict):
        raise bad(": not an object")
    if body.get("v") != _CONTINUE_VERSION:
        raise bad(f": server does not recognize this encoded version {body.get('v')}")
    rv, start = body.get("rv"), body.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or rv == 0:
        raise bad(": incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not isinstance(start, str) or not start:
        raise bad(": encoded start key empty (version meta.k8s.io/v1)")
    key = start if start.startswith("/") else "/" + start
    if posixpath.normpath(key) != key or key.startswith("//"):
        raise bad(f": {start}")
    return rv, key[1:]
