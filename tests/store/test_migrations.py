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

from flock.model import DEFAULT_NETWORK, AllocationState, PortMapping
from flock.store import FILENAME, MIGRATIONS, StoreTooNew, SyncStore
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
        assert len(lines) == 1 and "2 allocation(s)" in lines[0].getMessage() and "'flock'" in lines[0].getMessage()
        rows = {a.container_id: a for a in store.list()}
        web = rows["c0ffee01"]
        assert (web.namespace, web.pod, web.pod_uid, web.netns) == ("shop", "web-0", "uid-1", "/var/run/netns/cni-1")
        assert (web.ip6, web.ip4) == (ipaddress.ip_address("2001:db8:0:1::5"), ipaddress.ip_address("198.51.100.2"))
        assert web.anycast == (ipaddress.ip_address("2001:db8:ffff::53"),)
        assert web.addresses == (ipaddress.ip_address("2001:db8:0:1::80"),)
        assert (web.state, web.created, web.updated) == (AllocationState.COMMITTED, 1.5, 2.5)
        assert rows["c0ffee02"].state is AllocationState.PENDING and rows["c0ffee02"].ip4 is None
        assert {a.network for a in rows.values()} == {DEFAULT_NETWORK} and all(
            not a.port_mappings for a in rows.values()
        )
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


def test_the_previous_release_refuses_this_releases_database_and_changes_nothing(
    previous_release: Path, tmp_path: Path
) -> None:
    """A rollback without restoring the database: the old code names the versions and leaves the file alone."""
    SyncStore.open(tmp_path).close()
    before = (tmp_path / FILENAME).read_bytes()
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(previous_release)!r})\n"
            "from flock.store import SyncStore\nSyncStore.open(sys.argv[1])",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "StoreTooNew" in done.stderr and "schema version 2" in done.stderr, done.stderr
    assert (tmp_path / FILENAME).read_bytes() == before
    with sqlite3.connect(tmp_path / FILENAME) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_this_release_refuses_a_newer_database(tmp_path: Path) -> None:
    SyncStore.open(tmp_path, migrations=(*MIGRATIONS, lambda conn: None)).close()
    with pytest.raises(StoreTooNew) as info:
        SyncStore.open(tmp_path)
    assert "schema version 3" in info.value.details and "up to 2" in info.value.details
