"""Schema migrations from databases the previous release wrote with its own code (checked out of git
history, run in a subprocess), never from hand-made files: v1 → v2 adds the network each attachment
was made through (v1 rows take the installer's default, ``flock``, and one log line says so) and the
hostPort mappings; every other field comes through unchanged, and the migrated store works."""

from __future__ import annotations

import ipaddress
import json
import logging
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from flock.model import DEFAULT_NETWORK, Allocation, AllocationState, PortMapping
from flock.store import FILENAME, MIGRATIONS, StoreTooNew, SyncStore
from flock.store._schema import backup_path
from flock.testing.releases import PREVIOUS_RELEASE, MissingRelease, checkout

WRITE_V1 = textwrap.dedent(
    """
    import ipaddress, json, sys
    from flock.model import Allocation, AllocationState
    from flock.store import SyncStore
    store = SyncStore.open(sys.argv[1])
    A = ipaddress.ip_address
    store.put(Allocation(
        container_id="c0ffee01", namespace="shop", pod="web-0", pod_uid="uid-1", if_name="eth0",
        netns="/var/run/netns/cni-1", ip6=A("2001:db8:0:1::5"), ip4=A("198.51.100.2"),
        anycast=(A("2001:db8:ffff::53"),), addresses=(A("2001:db8:0:1::80"),),
        state=AllocationState.PENDING, created=1.5, updated=1.5,
    ))
    store.commit("c0ffee01", now=2.5)
    store.put(Allocation(
        container_id="c0ffee02", namespace="", pod="podman-ctr", pod_uid="", if_name="eth0",
        netns="/run/netns/netns-2", ip6=A("2001:db8:0:1::6"), state=AllocationState.PENDING, created=3.0, updated=3.0,
    ))
    print(json.dumps(store.settings()))
    store.close()
    """
)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return checkout(PREVIOUS_RELEASE, tmp_path_factory.mktemp("previous-release"))
    except MissingRelease as exc:
        pytest.fail(str(exc))


def _written_by_previous_release(release: Path, state_dir: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(release)!r})\n{WRITE_V1}", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_v1_database_from_the_previous_release_migrates_and_keeps_every_row(
    previous_release: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _written_by_previous_release(previous_release, tmp_path)
    assert settings["schema_version"] == 1  # what that release wrote
    with caplog.at_level(logging.WARNING, logger="flock.store"):
        store = SyncStore.open(tmp_path)
    try:
        assert store.settings()["schema_version"] == len(MIGRATIONS) == 2
        lines = [r for r in caplog.records if "schema v2" in r.getMessage()]
        assert len(lines) == 1, lines
        said = lines[0].getMessage()
        assert "1 Kubernetes pod allocation(s)" in said and "'flock'" in said and "1 container(s) without a pod" in said
        rows = {a.container_id: a for a in store.list()}
        web = rows["c0ffee01"]
        assert (web.namespace, web.pod, web.pod_uid, web.netns) == ("shop", "web-0", "uid-1", "/var/run/netns/cni-1")
        assert (web.ip6, web.ip4) == (ipaddress.ip_address("2001:db8:0:1::5"), ipaddress.ip_address("198.51.100.2"))
        assert web.anycast == (ipaddress.ip_address("2001:db8:ffff::53"),)
        assert web.addresses == (ipaddress.ip_address("2001:db8:0:1::80"),)
        assert (web.state, web.created, web.updated) == (AllocationState.COMMITTED, 1.5, 2.5)
        assert rows["c0ffee02"].state is AllocationState.PENDING and rows["c0ffee02"].ip4 is None
        # the pod's row: the Kubernetes network; podman's container: unknown (no GC for a named network takes it)
        assert (rows["c0ffee01"].network, rows["c0ffee02"].network) == (DEFAULT_NETWORK, "")
        assert all(not a.port_mappings for a in rows.values())
        # the migrated store works: new fields written and read back
        store.put(attrs.evolve(rows["c0ffee02"], network="podman", port_mappings=(PortMapping(8080, 80),)))
        again = store.get("c0ffee02")
        assert again is not None and again.network == "podman" and again.port_mappings == (PortMapping(8080, 80),)
    finally:
        store.close()
    # opened again: nothing more to migrate, nothing logged
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flock.store"):
        SyncStore.open(tmp_path).close()
    assert not [r for r in caplog.records if "schema v2" in r.getMessage()]


USE_V2 = textwrap.dedent(
    """
    import ipaddress, json, sys
    from flock.model import Allocation, AllocationState
    from flock.store import SyncStore
    store = SyncStore.open(sys.argv[1])
    seen = sorted(a.container_id for a in store.list())
    store.commit("c0ffee02", now=9.0)
    store.put(Allocation(
        container_id="c0ffee03", namespace="shop", pod="db-0", pod_uid="uid-3", if_name="eth0",
        netns="/run/netns/cni-3", ip6=ipaddress.ip_address("2001:db8:0:1::7"), state=AllocationState.PENDING,
        created=4.0, updated=4.0,
    ))
    store.delete("c0ffee04")
    print(json.dumps({"seen": seen, "settings": store.settings()}))
    store.close()
    """
)


def test_the_previous_release_keeps_working_on_this_releases_database(previous_release: Path, tmp_path: Path) -> None:
    """A rollback (the DaemonSet's previous image) without touching the database: schema v2 only added
    columns with defaults and left user_version at 1, so the previous release's own code reads and writes
    it; what it cannot know (network, hostPorts) survives its writes, and this release takes the file back."""
    store = SyncStore.open(tmp_path)
    base = dict(namespace="shop", pod_uid="", if_name="eth0", state=AllocationState.PENDING, created=1.0, updated=1.0)
    rows = [
        Allocation(container_id="c0ffee01", pod="web-0", netns="/run/netns/cni-1", ip6=ipaddress.ip_address("2001:db8:0:1::5"),
                   network="flock", port_mappings=(PortMapping(8080, 80),), **base),
        Allocation(container_id="c0ffee02", pod="", netns="/run/netns/cni-2", ip6=ipaddress.ip_address("2001:db8:0:1::6"),
                   network="flock-podman", port_mappings=(PortMapping(53, 53, "udp"),), **{**base, "namespace": ""}),
        Allocation(container_id="c0ffee04", pod="gone-0", netns="/run/netns/cni-4", ip6=ipaddress.ip_address("2001:db8:0:1::8"), **base),
    ]  # fmt: skip
    for row in rows:
        store.put(row)
    store.close()
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(previous_release)!r})\n{USE_V2}",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    old = json.loads(done.stdout)
    assert old["seen"] == ["c0ffee01", "c0ffee02", "c0ffee04"] and old["settings"]["schema_version"] == 1
    store = SyncStore.open(tmp_path)
    try:
        back = {a.container_id: a for a in store.list()}
        assert set(back) == {"c0ffee01", "c0ffee02", "c0ffee03"}
        assert back["c0ffee01"] == rows[0]
        assert back["c0ffee02"] == attrs.evolve(rows[1], state=AllocationState.COMMITTED, updated=9.0)
        assert (back["c0ffee03"].network, back["c0ffee03"].port_mappings) == (DEFAULT_NETWORK, ())
        assert store.settings()["schema_version"] == 2
    finally:
        store.close()


def test_a_newer_database_this_release_can_use_is_opened_as_it_is(tmp_path: Path, caplog) -> None:
    """What a later flock whose migration only adds would leave (schema 3, still usable by schema 1)."""
    SyncStore.open(tmp_path).close()
    with sqlite3.connect(tmp_path / FILENAME) as conn:
        conn.execute("ALTER TABLE allocations ADD COLUMN later TEXT NOT NULL DEFAULT 'x'")
        conn.execute("UPDATE flock_meta SET value = 3 WHERE key = 'schema'")
    with caplog.at_level(logging.WARNING, logger="flock.store"):
        store = SyncStore.open(tmp_path)
    try:
        assert any("newer flock (schema 3)" in r.getMessage() for r in caplog.records)
        store.put(attrs.evolve(_row(), port_mappings=(PortMapping(80, 80),)))
        assert store.get("c0ffee01") == attrs.evolve(_row(), port_mappings=(PortMapping(80, 80),))
        assert store.settings()["schema_version"] == 3 and store.settings()["usable_by_schema"] == 1
    finally:
        store.close()


def _row() -> Allocation:
    return Allocation(
        container_id="c0ffee01", namespace="shop", pod="web-0", pod_uid="", if_name="eth0",
        netns="/run/netns/cni-1", ip6=ipaddress.ip_address("2001:db8:0:1::5"),
    )  # fmt: skip


def test_a_newer_database_this_release_cannot_use_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    SyncStore.open(tmp_path, migrations=(*MIGRATIONS, lambda conn: None)).close()
    with sqlite3.connect(tmp_path / FILENAME) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")  # a newer flock may run another mode: not ours to change
    before = (tmp_path / FILENAME).read_bytes()
    with pytest.raises(StoreTooNew) as info:
        SyncStore.open(tmp_path)
    assert info.value.details.endswith(
        ": schema version 3 (usable by flock schema 3 and later), this flock knows up to 2"
    )
    assert (tmp_path / FILENAME).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILENAME]


def test_a_migration_older_releases_cannot_follow_leaves_a_backup_they_can_use(tmp_path: Path) -> None:
    store = SyncStore.open(tmp_path)
    store.put(_row())
    store.close()

    def incompatible(conn: sqlite3.Connection) -> None:  # schema 3, not in READABLE_BY: older code must not open it
        conn.execute("UPDATE allocations SET netns = 'moved'")

    migrated = SyncStore.open(tmp_path, migrations=(*MIGRATIONS, incompatible))
    assert migrated.settings()["usable_by_schema"] == 3 and migrated.get("c0ffee01").netns == "moved"
    migrated.close()
    backup = backup_path(tmp_path / FILENAME, 2)
    assert backup.exists()
    restored = tmp_path / "restored"
    restored.mkdir()
    backup.rename(restored / FILENAME)  # the rollback: this release opens the copy as it was
    store = SyncStore.open(restored)
    try:
        assert store.get("c0ffee01") == _row() and store.settings()["schema_version"] == 2
    finally:
        store.close()


def test_rows_from_before_v2_take_the_network_name_the_agent_is_given(
    previous_release: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node installed with flock-install-cni --network-name kube: its old rows belong to "kube", so a
    GC for "kube" still removes a leaked one (with the default name it never would)."""
    _written_by_previous_release(previous_release, tmp_path)
    with caplog.at_level(logging.WARNING, logger="flock.store"):
        store = SyncStore.open(tmp_path, legacy_network="kube")
    try:
        assert sorted(a.network for a in store.list()) == ["", "kube"]
        assert any("network 'kube'" in r.getMessage() for r in caplog.records)
        store.put(attrs.evolve(_row(), container_id="c0ffee09", network="podman"))
    finally:
        store.close()
    store = SyncStore.open(tmp_path, legacy_network="other")  # migrated once: a later start changes nothing
    try:
        assert sorted(a.network for a in store.list()) == ["", "kube", "podman"]
    finally:
        store.close()
