"""The allocation table: its schema and migrations, the SQL flock runs on it,
and the mapping between a row and :class:`flock.model.Allocation`.

One row per container ID holding every field of an allocation.  Each write is
a single statement, so a crash at any instant leaves every row either as it
was or as it was written — never half.
"""

from __future__ import annotations

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
    hostPort mappings.  Rows from v1 recorded no network: they take the installer's default name."""
    rows = conn.execute("SELECT count(*) FROM allocations").fetchone()[0]
    conn.execute(f"ALTER TABLE allocations ADD COLUMN network TEXT NOT NULL DEFAULT '{DEFAULT_NETWORK}'")
    conn.execute("ALTER TABLE allocations ADD COLUMN port_mappings TEXT NOT NULL DEFAULT '[]'")
    log.warning(
        "allocation database migrated to schema v2: %d allocation(s) stored before it recorded no network "
        "and now belong to network %r (the installer's default name); GC for another network leaves them alone",
        rows,
        DEFAULT_NETWORK,
        extra={"op": "store", "schema": 2, "allocations": rows, "network": DEFAULT_NETWORK},
    )


# MIGRATIONS[i] takes a database from schema version i to i + 1; the schema
# version lives in PRAGMA user_version.  A later flock appends here.
MIGRATIONS: tuple[Migration, ...] = (_create_v1, _v2_network_and_ports)

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


def prepare(path: Path, conn: sqlite3.Connection, migrations: Sequence[Migration]) -> None:
    """Set the connection up (WAL, synchronous=NORMAL: see :mod:`flock.store`,
    "Durability"), check the file and bring
    its schema to ``len(migrations)``, each migration in its own transaction."""
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        conn.execute("PRAGMA synchronous = NORMAL")
        problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        raise from_sqlite(path, "the allocation database is unreadable or corrupt", exc) from None
    if mode.lower() != "wal":
        raise StoreError(path, "the allocation database cannot use WAL", f"journal_mode is {mode}")
    if problems != ["ok"]:
        raise StoreCorrupt(path, "the allocation database is corrupt", "; ".join(problems[:5]))
    if version > len(migrations):
        raise StoreTooNew(
            path,
            "the allocation database is from a newer flock",
            f"schema version {version}, this flock knows up to {len(migrations)}",
        )
    if version >= 1:
        _check_table(path, conn)  # before a migration alters it: a foreign file is named as such
    for target, migrate in enumerate(migrations[version:], start=version + 1):
        try:
            conn.execute("BEGIN IMMEDIATE")
            migrate(conn)
            conn.execute(f"PRAGMA user_version = {int(target)}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(
                path, "cannot migrate the allocation database", f"to schema version {target}: {exc}"
            ) from None
    _check_table(path, conn)


def _check_table(path: Path, conn: sqlite3.Connection) -> None:
    try:
        conn.execute("SELECT container_id FROM allocations LIMIT 0")
    except sqlite3.Error as exc:
        raise StoreCorrupt(path, "the allocation database has no allocations table", str(exc)) from None
