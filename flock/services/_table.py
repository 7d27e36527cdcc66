"""The desired state of the services table, as a value (what :mod:`._compile` makes and :mod:`._nft` renders).

Everything that changes with Services and endpoints is here as named pieces
the renderer can diff: chains (name → rules: the shared ``rand``/``nprand``
chains and the few per-service ones), per-endpoint affinity sets, and the
elements of the table's fixed maps and sets.  The
fixed skeleton (hooks, dispatch chains, map declarations) depends only on
:class:`Skeleton`; a change there is a full replace.  Rule text is made by
:mod:`._nft`'s statement builders from addresses, ints and names flock made
itself, never from API strings.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ._model import Family

TABLE = "flock-services"
MASQUERADE_MARK = 0x4000


@attrs.frozen
class Skeleton:
    table: str = TABLE
    masquerade_mark: int = MASQUERADE_MARK
    filter_priority: int = -10  # reject for "no endpoints" before flock's own forward/input filter


@attrs.frozen
class AffinitySet:
    """A dynamic set of client addresses with a timeout: ClientIP affinity to one endpoint."""

    family: Family
    timeout: int


@attrs.frozen
class HealthCheck:
    """What the healthCheckNodePort server answers for one eTP Local Service (kube-proxy's JSON)."""

    namespace: str
    name: str
    local_endpoints: int


@attrs.frozen
class Counted:
    """What a counted map element counts: new connections of one Service port sent to an endpoint
    (``connections``), or refused or dropped for want of one (``rejected``)."""

    namespace: str
    service: str
    port: str  # the port's name, or its number when the Service's only port has none
    kind: str  # "connections" or "rejected"


@attrs.frozen(eq=True)
class ServicesTable:
    skeleton: Skeleton = attrs.field(factory=Skeleton)
    chains: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    affinity_sets: Mapping[str, AffinitySet] = attrs.field(factory=dict)
    # map or set name (one of the skeleton's) → its elements: (key, verdict) for maps, (key, None) for sets
    elements: Mapping[str, frozenset[tuple[str, str | None]]] = attrs.field(factory=dict)
    health_checks: Mapping[int, HealthCheck] = attrs.field(factory=dict)
    # map keys two Services claim (an externalIP:port shared, a hand-made EndpointSlice…): the first by
    # namespace/name keeps the key; the rest are reported here, for the caller to log (not rendered)
    conflicts: tuple[str, ...] = attrs.field(default=(), eq=False)
    # (map, key) → the Service port its element's counter counts (derived from the elements: not compared)
    counted: Mapping[tuple[str, str], Counted] = attrs.field(factory=dict, eq=False)
