"""Allocations on disk: SQLite at ``<state_dir>/flock.db`` (WAL, synchronous=FULL).

One row per container ID holding every field of :class:`flock.model.Allocation`.
Each write is a single statement, so a crash at any instant leaves every row
either as it was or as it was written — never half.

Two faces:

* :class:`SyncStore` — the blocking core, used by one thread only (the
  crash test's child process uses it directly).
* :func:`open_store` → :class:`Store` — the Trio face.  A dedicated thread
  owns the connection; every call is queued to it, so no sqlite call runs on
  the Trio thread and the connection never changes threads.  A call cannot
  be abandoned half-way: cancellation takes effect once the database has
  answered, so the caller always knows whether a write happened.

Group commit: the thread takes every call queued at that moment and runs
them in ONE transaction (one fsync), each inside its own savepoint, and
answers every caller only after that COMMIT has returned — so nothing is
acknowledged before it is on disk, and a call that fails is rolled back to
its savepoint without failing or losing the others.  If the group's
transaction itself is lost (COMMIT fails, or SQLite rolls the whole
transaction back on an I/O error), no caller has been answered yet: each
call is run again on its own, as if it had been queued alone.  A call
queued alone runs as a single autocommit statement, exactly as without
grouping.

Error handling: nothing is retried here.  A database that is unreadable,
corrupt, or written by a newer flock raises :class:`StoreError` at open —
it is never replaced — and the agent exits so an operator can look.
Failures of later calls propagate as :class:`StoreError` too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import outcome
import trio

from flock.faults import StoreUnavailable
from flock.model import Allocation, AllocationState

FILENAME = "flock.db"
T = TypeVar("T")
Migration = Callable[[sqlite3.Connection], None]

_COLUMNS = (
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
)


class StoreError(StoreUnavailable):
    """The allocation database cannot be used; ``path`` says which file."""

    def __init__(self, path: os.PathLike | str, msg: str, details: str = "") -> None:
        self.path = Path(path)
        super().__init__(msg, f"{path}: {details}" if details else str(path))


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


# MIGRATIONS[i] takes a database from schema version i to i + 1; the schema
# version lives in PRAGMA user_version.  A later flock appends here.
MIGRATIONS: tuple[Migration, ...] = (_create_v1,)


def _encode(a: Allocation) -> tuple[Any, ...]:
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
    )


def _decode(path: Path, row: sqlite3.Row) -> Allocation:
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
        )
    except (TypeError, ValueError) as exc:
        raise StoreError(path, "unreadable allocation row", f"container {cid!r}: {exc}") from None


class _GroupLost(Exception):
    """The group's transaction is gone; nothing in it was acknowledged."""


@attrs.define(eq=False)
class SyncStore:
    """The blocking store.  Not thread-safe: one thread opens, uses and closes it."""

    path: Path
    _conn: sqlite3.Connection

    @classmethod
    def open(cls, state_dir: os.PathLike | str, *, migrations: Sequence[Migration] = MIGRATIONS) -> SyncStore:
        """Open (creating or migrating) ``<state_dir>/flock.db``; raises :class:`StoreError`."""
        path = Path(state_dir) / FILENAME
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            conn = sqlite3.connect(path, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(path, "cannot open the allocation database", str(exc)) from None
        try:
            conn.row_factory = sqlite3.Row
            _prepare(path, conn, migrations)
        except BaseException:
            conn.close()
            raise
        return cls(path, conn)

    def close(self) -> None:
        self._conn.close()

    def settings(self) -> dict[str, Any]:
        """What this connection runs with (for start-up logs and tests)."""
        return {
            "journal_mode": self._pragma("journal_mode"),
            "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[self._pragma("synchronous")],
            "schema_version": self._pragma("user_version"),
        }

    def put(self, allocation: Allocation) -> None:
        """Insert or replace the row for ``allocation.container_id``, exactly
        as given (state included): the caller owns the pending → committed
        order, and :meth:`commit` is the usual way to advance it."""
        cols = ", ".join(_COLUMNS)
        marks = ", ".join("?" * len(_COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[1:])
        self._run(
            f"INSERT INTO allocations ({cols}) VALUES ({marks}) ON CONFLICT (container_id) DO UPDATE SET {updates}",
            _encode(allocation),
        )

    def commit(self, container_id: str, *, now: float | None = None) -> Allocation:
        """Move a row from pending to committed (a committed row stays so).
        A missing row raises :class:`StoreError`."""
        rows = self._run(
            "UPDATE allocations SET state = 'committed', updated = ? WHERE container_id = ? RETURNING *",
            (time.time() if now is None else now, container_id),
        ).fetchall()
        if not rows:
            raise StoreError(self.path, "no allocation to commit", f"container {container_id!r}")
        return _decode(self.path, rows[0])

    def get(self, container_id: str) -> Allocation | None:
        rows = self._run("SELECT * FROM allocations WHERE container_id = ?", (container_id,)).fetchall()
        return _decode(self.path, rows[0]) if rows else None

    def delete(self, container_id: str) -> bool:
        """Remove the row; False when there was none."""
        return self._run("DELETE FROM allocations WHERE container_id = ?", (container_id,)).rowcount > 0

    def list(self, state: AllocationState | None = None) -> list[Allocation]:
        if state is None:
            rows = self._run("SELECT * FROM allocations ORDER BY created, container_id", ()).fetchall()
        else:
            rows = self._run(
                "SELECT * FROM allocations WHERE state = ? ORDER BY created, container_id", (state.value,)
            ).fetchall()
        return [_decode(self.path, r) for r in rows]

    def run_group(self, calls: Sequence[Callable[[], T]]) -> list[outcome.Outcome]:
        """Run *calls* (methods of this store) in one transaction, each in its
        own savepoint; one outcome per call, all durable when this returns.
        One failing call is rolled back alone; a lost transaction re-runs
        every call on its own (see the module doc)."""
        if len(calls) == 1:
            return [outcome.capture(calls[0])]
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            results = [self._in_savepoint(call) for call in calls]
            self._conn.execute("COMMIT")
        except (_GroupLost, sqlite3.Error):
            self._abandon_group()
            return [outcome.capture(call) for call in calls]
        return results

    def _in_savepoint(self, call: Callable[[], T]) -> outcome.Outcome:
        try:
            self._conn.execute("SAVEPOINT flock_call")
        except sqlite3.Error:
            raise _GroupLost() from None
        result = outcome.capture(call)
        if not self._conn.in_transaction:
            raise _GroupLost()  # SQLite rolled the whole transaction back
        try:
            if isinstance(result, outcome.Error):
                self._conn.execute("ROLLBACK TO flock_call")
            self._conn.execute("RELEASE flock_call")
        except sqlite3.Error:
            raise _GroupLost() from None
        return result

    def _abandon_group(self) -> None:
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the retries below report whatever is wrong with the database

    def _pragma(self, name: str) -> Any:
        return self._run(f"PRAGMA {name}", ()).fetchone()[0]

    def _run(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise StoreError(self.path, "allocation database failed", str(exc)) from None


def _prepare(path: Path, conn: sqlite3.Connection, migrations: Sequence[Migration]) -> None:
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        conn.execute("PRAGMA synchronous = FULL")
        problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        raise StoreError(path, "the allocation database is unreadable or corrupt", str(exc)) from None
    if mode.lower() != "wal":
        raise StoreError(path, "the allocation database cannot use WAL", f"journal_mode is {mode}")
    if problems != ["ok"]:
        raise StoreError(path, "the allocation database is corrupt", "; ".join(problems[:5]))
    if version > len(migrations):
        raise StoreError(
            path,
            "the allocation database is from a newer flock",
            f"schema version {version}, this flock knows up to {len(migrations)}",
        )
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
    try:
        conn.execute("SELECT container_id FROM allocations LIMIT 0")
    except sqlite3.Error as exc:
        raise StoreError(path, "the allocation database has no allocations table", str(exc)) from None


# Upper bound on calls per group: a burst's callers wait for one fsync, not
# for an unbounded transaction.
MAX_GROUP = 64

Group = Callable[[Sequence[Callable[[], Any]]], "list[outcome.Outcome]"]


@attrs.frozen
class _Job:
    fn: Callable[[], Any]
    deliver: Callable[[outcome.Outcome], None]
    # Jobs with the same ``group`` queued together run as one group.
    group: Group | None


@attrs.define(eq=False)
class _DbThread:
    """One thread that runs queued blocking calls in order, grouping those
    that allow it (see the module doc)."""

    _jobs: queue.SimpleQueue = attrs.field(init=False, factory=queue.SimpleQueue)
    _thread: threading.Thread = attrs.field(init=False)
    _stopped: bool = attrs.field(init=False, default=False)
    # Calls that ran in a group of more than one (for tests and benchmarks).
    grouped_calls: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="flock-store", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        carried: list[_Job | None] = []
        while True:
            job = carried.pop() if carried else self._jobs.get()
            if job is None:
                return
            if job.group is None:
                job.deliver(outcome.capture(job.fn))
                continue
            batch = [job]
            while len(batch) < MAX_GROUP:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None or more.group != job.group:
                    carried.append(more)
                    break
                batch.append(more)
            results = job.group([j.fn for j in batch])
            if len(batch) > 1:
                self.grouped_calls += len(batch)
            for j, result in zip(batch, results):
                j.deliver(result)

    async def call(self, fn: Callable[[], T], *, group: Group | None = None) -> T:
        """Run *fn* on the thread (in a group run by *group*, if given).
        Cancellation waits for *fn* to finish."""
        if self._stopped:
            raise RuntimeError("the allocation store is closed")
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
        self._jobs.put(_Job(fn, lambda result: token.run_sync_soon(trio.lowlevel.reschedule, task, result), group))
        return await trio.lowlevel.wait_task_rescheduled(lambda _raise_cancel: trio.lowlevel.Abort.FAILED)

    async def stop(self) -> None:
        self._stopped = True
        self._jobs.put(None)
        await trio.to_thread.run_sync(self._thread.join)


@attrs.define(eq=False)
class Store:
    """The Trio face of :class:`SyncStore`; get one from :func:`open_store`."""

    _thread: _DbThread
    _core: SyncStore

    @property
    def path(self) -> Path:
        return self._core.path

    @property
    def grouped_calls(self) -> int:
        """Calls that shared a transaction with others so far."""
        return self._thread.grouped_calls

    async def settings(self) -> dict[str, Any]:
        return await self._call(self._core.settings)

    async def put(self, allocation: Allocation) -> None:
        await self._call(lambda: self._core.put(allocation))

    async def commit(self, container_id: str, *, now: float | None = None) -> Allocation:
        return await self._call(lambda: self._core.commit(container_id, now=now))

    async def get(self, container_id: str) -> Allocation | None:
        return await self._call(lambda: self._core.get(container_id))

    async def delete(self, container_id: str) -> bool:
        return await self._call(lambda: self._core.delete(container_id))

    async def list(self, state: AllocationState | None = None) -> list[Allocation]:
        return await self._call(lambda: self._core.list(state))

    async def _call(self, fn: Callable[[], T]) -> T:
        return await self._thread.call(fn, group=self._core.run_group)


@contextlib.asynccontextmanager
async def open_store(
    state_dir: os.PathLike | str, *, migrations: Sequence[Migration] = MIGRATIONS
) -> AsyncIterator[Store]:
    """Open the store on its own thread; close it (shielded) on exit.
    :class:`StoreError` from opening propagates."""
    thread = _DbThread()
    # Closing is shielded without a deadline: a queued call cannot be
    # abandoned anyway, and closing only waits for the call in flight.
    try:
        core = await thread.call(lambda: SyncStore.open(state_dir, migrations=migrations))
        try:
            yield Store(thread, core)
        finally:
            with trio.CancelScope(shield=True):
                await thread.call(core.close)
    finally:
        with trio.CancelScope(shield=True):
            await thread.stop()
