import inspect
import ipaddress
import sqlite3
import threading

import attrs
import pytest
import trio
import trio.testing

from flock.model import Allocation, AllocationState
from flock.pods import AllocationStore, cni_error
from flock.store import (
    FILENAME,
    MIGRATIONS,
    AllocationNotFound,
    Store,
    StoreCorrupt,
    StoreError,
    StoreTooNew,
    SyncStore,
    open_store,
)
from flock.testing.pods import MemoryAllocations

A = ipaddress.ip_address
PENDING, COMMITTED = AllocationState.PENDING, AllocationState.COMMITTED


def alloc(cid="c1", created=1.0, **kw):
    base = dict(
        container_id=cid,
        namespace="prod",
        pod="web-0",
        pod_uid="uid-1",
        if_name="eth0",
        netns=f"/var/run/netns/{cid}",
        ip6=A("2001:db8:0:1::5"),
        ip4=A("198.51.100.2"),
        anycast=(A("2001:db8:ffff::53"), A("203.0.113.53")),
        addresses=(A("2001:db8:0:1::80"),),
        state=PENDING,
        created=created,
        updated=created,
    )
    return Allocation(**{**base, **kw})


def test_round_trip_every_field(tmp_path):
    store = SyncStore.open(tmp_path)
    row = alloc()
    store.put(row)
    assert store.get("c1") == row
    bare = alloc("c2", created=2.0, ip6=None, ip4=None, anycast=(), addresses=())
    store.put(bare)
    assert store.get("c2") == bare
    assert store.get("nope") is None
    store.close()


def test_upsert_commit_list_delete(tmp_path):
    store = SyncStore.open(tmp_path)
    store.put(alloc("c1"))
    store.put(alloc("c1", netns="/var/run/netns/other"))  # upsert replaces
    store.put(alloc("c2", created=2.0))
    committed = store.commit("c1", now=5.0)
    assert committed.state is COMMITTED and committed.updated == 5.0
    assert committed.netns == "/var/run/netns/other"
    assert [a.container_id for a in store.list()] == ["c1", "c2"]
    assert [a.container_id for a in store.list(COMMITTED)] == ["c1"]
    assert [a.container_id for a in store.list(PENDING)] == ["c2"]
    assert store.delete("c1") is True
    assert store.delete("c1") is False
    with pytest.raises(AllocationNotFound, match="no allocation to commit") as info:
        store.commit("c1")
    assert "c1" in info.value.details and info.value.container_id == "c1"
    store.close()


def test_wal_full_sync_and_schema_version(tmp_path):
    store = SyncStore.open(tmp_path)
    assert store.settings() == {
        "journal_mode": "wal",
        "synchronous": "NORMAL",
        "schema_version": len(MIGRATIONS),
        "usable_by_schema": 1,  # every migration so far only adds: the first release's code still uses the file
    }
    store.close()
    assert (tmp_path / FILENAME).exists()


def test_rows_survive_reopen(tmp_path):
    store = SyncStore.open(tmp_path)
    store.put(alloc())
    store.commit("c1", now=3.0)
    store.close()
    again = SyncStore.open(tmp_path)
    assert again.get("c1") == alloc(state=COMMITTED, updated=3.0)
    again.close()


def _add_note(conn):
    conn.execute("ALTER TABLE allocations ADD COLUMN note TEXT NOT NULL DEFAULT ''")


def test_migration_hook_runs_and_newer_schema_is_refused(tmp_path):
    store = SyncStore.open(tmp_path)
    store.put(alloc())
    store.close()
    migrated = SyncStore.open(tmp_path, migrations=(*MIGRATIONS, _add_note))
    assert migrated.settings()["schema_version"] == len(MIGRATIONS) + 1
    assert migrated.get("c1") == alloc()
    migrated.close()
    with pytest.raises(StoreTooNew, match="from a newer flock") as info:
        SyncStore.open(tmp_path)
    assert f"schema version {len(MIGRATIONS) + 1}" in info.value.details
    assert str(tmp_path / FILENAME) in info.value.details


def test_failed_migration_leaves_the_old_version(tmp_path):
    SyncStore.open(tmp_path).close()

    def broken(conn):
        conn.execute("ALTER TABLE no_such_table ADD COLUMN x")

    with pytest.raises(StoreError, match="cannot migrate") as info:
        SyncStore.open(tmp_path, migrations=(*MIGRATIONS, broken))
    assert "no_such_table" in info.value.details
    store = SyncStore.open(tmp_path)
    assert store.settings()["schema_version"] == len(MIGRATIONS)
    store.close()


def test_garbage_file_is_an_error_and_is_left_alone(tmp_path):
    path = tmp_path / FILENAME
    junk = b"this is not a database, it is a shopping list\n" * 200
    path.write_bytes(junk)
    with pytest.raises(StoreCorrupt, match="unreadable or corrupt") as info:
        SyncStore.open(tmp_path)
    assert cni_error(info.value).code == 5
    assert str(path) in info.value.details
    assert path.read_bytes() == junk


def test_damaged_page_is_an_error(tmp_path):
    store = SyncStore.open(tmp_path)
    for i in range(300):
        store.put(alloc(f"c{i:04d}", created=float(i)))
    store.close()  # last connection: the WAL is checkpointed into the main file
    path = tmp_path / FILENAME
    data = bytearray(path.read_bytes())
    page = 4096
    data[2 * page : 3 * page] = b"\xff" * page
    path.write_bytes(bytes(data))
    with pytest.raises(StoreCorrupt, match="corrupt") as info:
        SyncStore.open(tmp_path)
    assert str(path) in info.value.details
    assert path.read_bytes() == bytes(data)


def test_unopenable_path_and_foreign_database(tmp_path):
    (tmp_path / "dir" / FILENAME).mkdir(parents=True)
    with pytest.raises(StoreError, match=r"cannot open|unreadable") as info:
        SyncStore.open(tmp_path / "dir")
    assert not isinstance(info.value, StoreCorrupt)  # nothing says the file is damaged
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    conn = sqlite3.connect(foreign / FILENAME)
    conn.execute("CREATE TABLE other (x)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with pytest.raises(StoreCorrupt, match="no allocations table"):
        SyncStore.open(foreign)


def test_unreadable_row_names_the_container(tmp_path):
    store = SyncStore.open(tmp_path)
    store.put(alloc())
    store.close()
    conn = sqlite3.connect(tmp_path / FILENAME)
    conn.execute("UPDATE allocations SET ip6 = 'banana'")
    conn.commit()
    conn.close()
    store = SyncStore.open(tmp_path)
    with pytest.raises(StoreCorrupt, match="unreadable allocation row") as info:
        store.list()
    assert "'c1'" in info.value.details and "banana" in info.value.details
    store.close()


def _store_threads():
    return [t for t in threading.enumerate() if t.name == "flock-store"]


async def test_async_store_runs_on_its_own_thread(tmp_path):
    with trio.fail_after(10):
        async with open_store(tmp_path) as store:
            assert len(_store_threads()) == 1
            await store.put(alloc())
            assert (await store.get("c1")) == alloc()
            assert (await store.commit("c1", now=2.0)).state is COMMITTED
            assert [a.container_id for a in await store.list(COMMITTED)] == ["c1"]
            assert (await store.settings())["synchronous"] == "NORMAL"
            with pytest.raises(AllocationNotFound):
                await store.commit("missing")
            assert await store.delete("c1") is True
            assert store.path == tmp_path / FILENAME
        assert _store_threads() == []


async def test_cancelled_write_still_lands(tmp_path):
    with trio.fail_after(10):
        async with open_store(tmp_path) as store:
            with trio.CancelScope() as scope:
                scope.cancel()
                await store.put(alloc())
                await trio.lowlevel.checkpoint()
            assert scope.cancelled_caught
            assert (await store.get("c1")) == alloc()


async def test_async_open_error_propagates_and_stops_the_thread(tmp_path):
    (tmp_path / FILENAME).write_bytes(b"garbage" * 1000)
    with trio.fail_after(10):
        with pytest.raises(StoreError, match="corrupt"):
            async with open_store(tmp_path):
                pytest.fail("opened a corrupt database")
    assert _store_threads() == []


async def test_use_after_close_is_an_error_not_a_hang(tmp_path):
    with trio.fail_after(10):
        async with open_store(tmp_path) as store:
            pass
        with pytest.raises(RuntimeError, match="closed"):
            await store.get("c1")


async def test_concurrent_calls_are_serialized_on_the_store_thread(tmp_path):
    with trio.fail_after(10):
        async with open_store(tmp_path) as store:
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(store.put, alloc(f"c{i:02d}", created=float(i)))
            assert [a.container_id for a in await store.list()] == [f"c{i:02d}" for i in range(50)]


# -- group commit ------------------------------------------------------------


def _refuse_container(path, cid):
    """A real SQL failure for one row: a trigger that aborts its insert."""
    conn = sqlite3.connect(path / FILENAME)
    conn.execute(
        f"CREATE TRIGGER refuse BEFORE INSERT ON allocations WHEN NEW.container_id = '{cid}' "
        "BEGIN SELECT RAISE(ABORT, 'refused by test'); END"
    )
    conn.commit()
    conn.close()


def test_a_failing_call_in_a_group_fails_alone(tmp_path):
    SyncStore.open(tmp_path).close()
    _refuse_container(tmp_path, "bad")
    store = SyncStore.open(tmp_path)
    store.put(alloc("old"))
    results = store.run_group(
        [
            lambda: store.put(alloc("a")),
            lambda: store.put(alloc("bad")),
            lambda: store.commit("missing"),
            lambda: store.commit("a", now=5.0),
            lambda: store.delete("old"),
            lambda: store.get("a"),
        ]
    )
    store.close()
    assert results[0].unwrap() is None
    with pytest.raises(StoreError, match="refused by test"):
        results[1].unwrap()
    with pytest.raises(StoreError, match="no allocation to commit"):
        results[2].unwrap()
    assert results[3].unwrap().state is COMMITTED
    assert results[4].unwrap() is True
    assert results[5].unwrap() == alloc("a", state=COMMITTED, updated=5.0)
    reopened = SyncStore.open(tmp_path)
    assert [(a.container_id, a.state) for a in reopened.list()] == [("a", COMMITTED)]
    reopened.close()


def test_a_lost_group_transaction_reruns_each_call_alone(tmp_path):
    store = SyncStore.open(tmp_path)

    def end_the_transaction():
        # What SQLite does on some I/O errors: the whole transaction is gone.
        store._conn.execute("ROLLBACK")

    results = store.run_group(
        [
            lambda: store.put(alloc("a")),
            end_the_transaction,
            lambda: store.put(alloc("b")),
        ]
    )
    store.close()
    assert results[0].unwrap() is None and results[2].unwrap() is None
    with pytest.raises(sqlite3.OperationalError, match="no transaction"):
        results[1].unwrap()  # run again alone, outside any transaction
    reopened = SyncStore.open(tmp_path)
    assert [a.container_id for a in reopened.list()] == ["a", "b"]
    reopened.close()


async def test_calls_queued_together_share_one_transaction(tmp_path):
    SyncStore.open(tmp_path).close()
    _refuse_container(tmp_path, "bad")
    release = threading.Event()
    with trio.fail_after(10):
        async with open_store(tmp_path) as store:
            outcomes = {}

            async def put(cid):
                try:
                    await store.put(alloc(cid))
                    outcomes[cid] = "ok"
                except StoreError as exc:
                    outcomes[cid] = exc.msg

            async with trio.open_nursery() as nursery:
                # Hold the store thread so the puts queue up behind it.
                nursery.start_soon(store._thread.call, release.wait)
                await trio.testing.wait_all_tasks_blocked()
                for cid in ["c0", "c1", "bad", "c2", "c3"]:
                    nursery.start_soon(put, cid)
                await trio.testing.wait_all_tasks_blocked()
                assert outcomes == {}
                release.set()
            assert store.grouped_calls == 5
            assert outcomes == {"c0": "ok", "c1": "ok", "bad": "allocation database failed", "c2": "ok", "c3": "ok"}
            assert [a.container_id for a in await store.list()] == ["c0", "c1", "c2", "c3"]


@pytest.mark.parametrize("implementation", [Store, MemoryAllocations])
def test_store_and_its_in_memory_stand_in_have_the_pod_layers_interface(implementation):
    # The pod layer drives allocations through its protocol; the SQLite store and
    # the virtual-time tests' stand-in must offer exactly those methods.
    for name, wanted in inspect.getmembers(AllocationStore, inspect.isfunction):
        if name.startswith("_"):
            continue
        got = getattr(implementation, name)
        assert inspect.iscoroutinefunction(got), name
        assert inspect.signature(got) == inspect.signature(wanted), name


async def test_in_memory_stand_in_fails_a_missing_commit_like_the_store():
    with pytest.raises(AllocationNotFound, match="no allocation to commit"):
        await MemoryAllocations().commit("missing")


@pytest.mark.parametrize(
    "error",
    [
        StoreError("/x/flock.db", "allocation database failed", "disk I/O error"),
        StoreCorrupt("/x/flock.db", "the allocation database is corrupt", "page 3"),
        StoreTooNew("/x/flock.db", "the allocation database is from a newer flock", "schema version 9"),
        AllocationNotFound("/x/flock.db", "no allocation to commit", "c1"),
    ],
)
def test_every_store_error_reaches_the_runtime_as_code_5(error):
    cni = cni_error(error)
    assert cni is not None and cni.code == 5
    assert (cni.msg, cni.details) == (error.msg, error.details) and "/x/flock.db" in cni.details


def test_every_write_commits_at_synchronous_normal_without_switching(tmp_path):
    """flock.store, "Durability": the connection stays at synchronous=NORMAL (each
    commit is written to the WAL file, not fsynced); no write, alone or in a group,
    changes that setting."""
    store = SyncStore.open(tmp_path)
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)
    try:
        store.put(alloc())
        store.commit("c1", now=2.0)
        store.put(attrs.evolve(alloc("c2", ip6=A("2001:db8::2"), ip4=A("198.51.100.2")), state=COMMITTED))
        assert store.delete("c1") is True
        group = [
            lambda: store.put(alloc("c3", ip6=A("2001:db8::3"), ip4=A("198.51.100.3"))),
            lambda: store.delete("c2"),
            lambda: store.commit("c3", now=3.0),
        ]
        assert [type(o.unwrap()).__name__ for o in store.run_group(group)] == ["NoneType", "bool", "Allocation"]
        assert not [s for s in seen if "synchronous" in s.lower()]
        assert store.settings()["synchronous"] == "NORMAL"
        assert [(a.container_id, a.state) for a in store.list()] == [("c3", COMMITTED)]
    finally:
        store.close()
