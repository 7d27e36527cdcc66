"""The blocking store: one sqlite3 connection, used by one thread only, and
group commit (many calls in one transaction, each in its own savepoint)."""

from __future__ import annotations

import builtins
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import outcome

from flock.model import DEFAULT_NETWORK, Allocation, AllocationState
from flock.store import _schema
from flock.store._errors import AllocationNotFound, StoreError, from_sqlite
from flock.store._schema import MIGRATIONS, Migration


class _GroupLost(Exception):
    """The group's transaction is gone; nothing in it was acknowledged."""


@attrs.define(eq=False)
class SyncStore:
    """The blocking store.  Not thread-safe: one thread opens, uses and closes it."""

    path: Path
    _conn: sqlite3.Connection

    @classmethod
    def open(
        cls,
        state_dir: os.PathLike[str] | str,
        *,
        migrations: Sequence[Migration] = MIGRATIONS,
        legacy_network: str = DEFAULT_NETWORK,
    ) -> SyncStore:
        """Open (creating or migrating) ``<state_dir>/flock.db``; raises a
        :class:`~flock.store.StoreError` subclass.  Rows from before schema v2, which recorded no
        network, take *legacy_network* (the network name the installer was given)."""
        path = Path(state_dir) / _schema.FILENAME
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            conn = sqlite3.connect(path, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(path, "cannot open the allocation database", str(exc)) from None
        try:
            conn.row_factory = sqlite3.Row
            _schema.prepare(path, conn, migrations, legacy_network=legacy_network)
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
            "schema_version": _schema.schema_of(self._conn)[0],
            "usable_by_schema": self._pragma("user_version"),
        }

    def put(self, allocation: Allocation) -> None:
        """Insert or replace the row for ``allocation.container_id``, exactly
        as given (state included): the caller owns the pending → committed
        order, and :meth:`commit` is the usual way to advance it."""
        self._run(_schema.PUT, _schema.encode(allocation))

    def commit(self, container_id: str, *, now: float | None = None) -> Allocation:
        """Move a row from pending to committed (a committed row stays so).
        A missing row raises :class:`~flock.store.AllocationNotFound`."""
        rows = self._run(_schema.COMMIT, (time.time() if now is None else now, container_id)).fetchall()
        if not rows:
            raise AllocationNotFound(self.path, "no allocation to commit", container_id)
        return _schema.decode(self.path, rows[0])

    def get(self, container_id: str) -> Allocation | None:
        rows = self._run(_schema.GET, (container_id,)).fetchall()
        return _schema.decode(self.path, rows[0]) if rows else None

    def delete(self, container_id: str) -> bool:
        """Remove the row; False when there was none."""
        return self._run(_schema.DELETE, (container_id,)).rowcount > 0

    def list(self, state: AllocationState | None = None) -> list[Allocation]:
        if state is None:
            rows = self._run(_schema.LIST_ALL, ()).fetchall()
        else:
            rows = self._run(_schema.LIST_IN_STATE, (state.value,)).fetchall()
        return [_schema.decode(self.path, r) for r in rows]

    def run_group(self, calls: Sequence[Callable[[], Any]]) -> builtins.list[outcome.Outcome]:
        """Run *calls* (methods of this store) in one transaction, each in its
        own savepoint; one outcome per call, all committed when this returns.
        One failing call is rolled back alone; a lost transaction re-runs
        every call on its own (see :mod:`flock.store`)."""
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

    def _in_savepoint(self, call: Callable[[], Any]) -> outcome.Outcome:
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
            raise from_sqlite(self.path, "allocation database failed", exc) from None
