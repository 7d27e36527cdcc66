"""The allocation table: its schema and migrations, the SQL flock runs on it,
and the mapping between a row and :class:`flock.model.Allocation`.

One row per container ID holding every field of an allocation.  Each write is
a single statement, so a crash at any instant leaves every row either as it
was or as it was written — never half.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flock.model import DEFAULT_NETWORK, Allocation, AllocationState, PortMapping
from flock.store._errors import StoreCorrupt, StoreError, StoreTooNew, from_sqlite

log = logging.getLogger("flock.store")

FILENAME = "flock.db"
Migration = Callable[[sqlite3.Connection], None]

COLUMNS = (
    "container_id",
    "namespace",
    "pod",
    "pod_uid",
    "if_name",
    "netns",
    "ip6",
    "ip4",
    "anycast",
    "addresses",
    "state",
    "created",
    "updated",
    "network",
    "port_mappings",
)


def _create_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE allocations (
            container_id TEXT PRIMARY KEY NOT NULL,
            namespace    TEXT NOT NULL,
            pod          TEXT NOT NULL,
            pod_uid      TEXT NOT NULL,
            if_name      TEXT NOT NULL,
            netns        TEXT NOT NULL,
            ip6          TEXT,
            ip4          TEXT,
            anycast      TEXT NOT NULL DEFAULT '[]',
            addresses    TEXT NOT NULL DEFAULT '[]',
            state        TEXT NOT NULL CHECK (state IN ('pending', 'committed')),
            created      REAL NOT NULL,
            updated      REAL NOT NULL
        ) WITHOUT ROWID
        """
    )


def _v2_network_and_ports(conn: sqlite3.Connection) -> None:
    """v2: the network each attachment was made through (GC concerns only its own network) and its
    hostPort mappings.  Rows from v1 recorded no network: ``''`` (unknown) until :func:`prepare`
    gives the Kubernetes pods' rows the agent's ``--network-name`` (and says so in one log line).

    Additive (columns with defaults): schema-v1 code still reads and writes the file (see READABLE_BY)."""
    conn.execute("CREATE TABLE IF NOT EXISTS flock_meta (key TEXT PRIMARY KEY NOT NULL, value) WITHOUT ROWID")
    # '' (unknown) is also what an older release's writes get: see _adopt_rows
    conn.execute("ALTER TABLE allocations ADD COLUMN network TEXT NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE allocations ADD COLUMN port_mappings TEXT NOT NULL DEFAULT '[]'")


ADOPT = "UPDATE allocations SET network = ? WHERE network = '' AND namespace != ''"


def _adopt_rows(conn: sqlite3.Connection, network: str, why: str) -> None:
    """Rows that recorded no network (schema v1's, or written since by an older release the node was
    rolled back to): a Kubernetes pod's belongs to *network*, the Kubernetes network (the agent's
    ``--network-name``); a container without a pod (podman, nerdctl) stays unknown — its network
    cannot be told, and a GC for a named network never removes it (its runtime's DEL still does)."""
    adopted = conn.execute(ADOPT, (network,)).rowcount
    unknown = conn.execute("SELECT count(*) FROM allocations WHERE network = ''").fetchone()[0]
    if adopted or unknown:
        log.warning(
            "%s: %d Kubernetes pod allocation(s) that recorded no network now belong to network %r (this "
            "agent's --network-name); %d container(s) without a pod keep an unknown network (GC leaves them alone)",
            why,
            adopted,
            network,
            unknown,
            extra={"op": "store", "adopted": adopted, "unknown": unknown, "network": network},
        )


# MIGRATIONS[i] takes a database from schema version i to i + 1.  A later flock appends here.
MIGRATIONS: tuple[Migration, ...] = (_create_v1, _v2_network_and_ports)

# Two numbers describe a file (see :func:`prepare`):
# - its schema version: ``flock_meta`` key "schema" (from v2 on; a v1 file has no flock_meta, and its
#   schema is its user_version);
# - PRAGMA user_version: the oldest schema whose code can still use the file — what every flock
#   release checks before touching it (v1's code compares user_version with the migrations it knows).
# A migration that only adds (columns with defaults, tables) keeps the file usable by older code: the
# schema goes up, user_version stays.  Only a migration older code would misread raises it (map it to
# itself here, or leave it out: unlisted versions count as incompatible).
READABLE_BY: dict[int, int] = {1: 1, 2: 1}

# The statements flock runs (parameters are always bound, never formatted in).
PUT = (
    f"INSERT INTO allocations ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
    f"ON CONFLICT (container_id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in COLUMNS[1:])}"
)
COMMIT = "UPDATE allocations SET state = 'committed', updated = ? WHERE container_id = ? RETURNING *"
GET = "SELECT * FROM allocations WHERE container_id = ?"
DELETE = "DELETE FROM allocations WHERE container_id = ?"
LIST_ALL = "SELECT * FROM allocations ORDER BY created, container_id"
LIST_IN_STATE = "SELECT * FROM allocations WHERE state = ? ORDER BY created, container_id"


def encode(a: Allocation) -> tuple[Any, ...]:
    """The row's values, in :data:`COLUMNS` order."""
    return (
        a.container_id,
        a.namespace,
        a.pod,
        a.pod_uid,
        a.if_name,
        a.netns,
        None if a.ip6 is None else str(a.ip6),
        None if a.ip4 is None else str(a.ip4),
        json.dumps([str(x) for x in a.anycast]),
        json.dumps([str(x) for x in a.addresses]),
        a.state.value,
        float(a.created),
        float(a.updated),
        a.network,
        json.dumps([m.to_json() for m in a.port_mappings]),
    )


def decode(path: Path, row: sqlite3.Row) -> Allocation:
    """The allocation a row holds; :class:`StoreCorrupt` if it does not decode."""
    cid = row["container_id"]
    try:
        return Allocation(
            container_id=cid,
            namespace=row["namespace"],
            pod=row["pod"],
            pod_uid=row["pod_uid"],
            if_name=row["if_name"],
            netns=row["netns"],
            ip6=None if row["ip6"] is None else ipaddress.IPv6Address(row["ip6"]),
            ip4=None if row["ip4"] is None else ipaddress.IPv4Address(row["ip4"]),
            anycast=tuple(ipaddress.ip_address(x) for x in json.loads(row["anycast"])),
            addresses=tuple(ipaddress.ip_address(x) for x in json.loads(row["addresses"])),
            state=AllocationState(row["state"]),
            created=float(row["created"]),
            updated=float(row["updated"]),
            network=str(row["network"]),
            port_mappings=tuple(PortMapping.from_json(m) for m in json.loads(row["port_mappings"])),
        )
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise StoreCorrupt(path, "unreadable allocation row", f"container {cid!r}: {exc}") from None


def schema_of(conn: sqlite3.Connection) -> tuple[int, int]:
    """(schema version, the oldest schema whose code can use the file) as the file says."""
    usable_by = conn.execute("PRAGMA user_version").fetchone()[0]
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'flock_meta'").fetchone() is None:
        return usable_by, usable_by
    row = conn.execute("SELECT value FROM flock_meta WHERE key = 'schema'").fetchone()
    return (int(row[0]) if row is not None else usable_by), usable_by


def prepare(
    path: Path, conn: sqlite3.Connection, migrations: Sequence[Migration], *, legacy_network: str = DEFAULT_NETWORK
) -> None:
    """Check the file, set the connection up (WAL, synchronous=NORMAL: see :mod:`flock.store`,
    "Durability") and bring its schema to ``len(migrations)``, each migration in its own transaction.
    Rows from before schema v2 (which recorded no network name) take *legacy_network*.

    A file from a newer flock: opened as it is (nothing migrated, one warning) when its user_version
    says this flock's schema can still use it; else :class:`StoreTooNew`, raised before anything is
    written — the file, its journal mode included, stays as the newer flock left it."""
    known = len(migrations)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        version, usable_by = schema_of(conn)
    except sqlite3.Error as exc:
        raise from_sqlite(path, "the allocation database is unreadable or corrupt", exc) from None
    if usable_by > known:
        raise StoreTooNew(
            path,
            "the allocation database is from a newer flock",
            f"schema version {version} (usable by flock schema {usable_by} and later), this flock knows up to {known}",
        )
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        conn.execute("PRAGMA synchronous = NORMAL")
        problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.Error as exc:
        raise from_sqlite(path, "the allocation database is unreadable or corrupt", exc) from None
    if mode.lower() != "wal":
        raise StoreError(path, "the allocation database cannot use WAL", f"journal_mode is {mode}")
    if problems != ["ok"]:
        raise StoreCorrupt(path, "the allocation database is corrupt", "; ".join(problems[:5]))
    if version > known:
        log.warning(
            "the allocation database is from a newer flock (schema %d) that keeps it usable by schema %d: "
            "opening it as it is; this flock (schema %d) uses what it knows of it",
            version,
            usable_by,
            known,
            extra={"op": "store", "schema": version, "usable_by": usable_by, "known": known},
        )
    if version >= 1:
        _check_table(path, conn)  # before a migration alters it: a foreign file is named as such
    if 1 <= version < known and any(READABLE_BY.get(t, t) > usable_by for t in range(version + 1, known + 1)):
        # Older code will not open the file after this: keep a copy it can use (docs/upgrading.md, "Rollback").
        _backup(path, conn, version)
    for target, migrate in enumerate(migrations[version:], start=version + 1):
        try:
            conn.execute("BEGIN IMMEDIATE")
            migrate(conn)
            if target == 2 and version >= 1:
                _adopt_rows(conn, legacy_network, "allocation database migrated to schema v2")
            if target >= 2:
                conn.execute(
                    "INSERT INTO flock_meta (key, value) VALUES ('schema', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (target,),
                )
            conn.execute(f"PRAGMA user_version = {int(READABLE_BY.get(target, target))}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(
                path, "cannot migrate the allocation database", f"to schema version {target}: {exc}"
            ) from None
    _check_table(path, conn)
    if version >= 2 and known >= 2:
        # an older release (a rollback) may have written rows since: they recorded no network either
        try:
            with conn:
                _adopt_rows(conn, legacy_network, "allocations written by an older flock")
        except sqlite3.Error as exc:
            raise from_sqlite(path, "cannot update the allocation database", exc) from None


def backup_path(path: Path, schema: int) -> Path:
    """Where an incompatible migration leaves the file as schema *schema* had it."""
    return path.with_name(f"{path.name}.schema-{schema}.backup")


def _backup(path: Path, conn: sqlite3.Connection, schema: int) -> None:
    target = backup_path(path, schema)
    try:
        with contextlib.closing(sqlite3.connect(target)) as copy:
            conn.backup(copy)
    except sqlite3.Error as exc:
        raise from_sqlite(
            path, "cannot back the allocation database up before migrating it", exc, str(target)
        ) from None
    log.warning(
        "allocation database backed up before a migration older flock releases cannot follow",
        extra={"op": "store", "schema": schema, "backup": str(target)},
    )


def _check_table(path: Path, conn: sqlite3.Connection) -> None:
    try:
        conn.execute("SELECT container_id FROM allocations LIMIT 0")
    except sqlite3.Error as exc:
        raise StoreCorrupt(path, "the allocation database has no allocations table", str(exc)) from None
