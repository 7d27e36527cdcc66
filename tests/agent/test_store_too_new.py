"""A database from a newer flock that this agent cannot use (the rollback that forgot the database):
the agent stays up and not ready, says why on /readyz, in its log and in every CNI answer (both
versions, what to do), and touches nothing — not the file, not the kernel; SIGTERM stops it cleanly.
Then the backup the newer release's migration left is put back, and the agent serves again."""

from __future__ import annotations

import sqlite3

import pytest

from flock.apiserver import PODS, pod_object
from flock.store import FILENAME, MIGRATIONS, SyncStore, backup_path
from flock.testing.agentlab import open_lab, wait_for

pytestmark = pytest.mark.usefixtures("require_root")


def test_an_agent_under_a_newer_database_refuses_everything_and_touches_nothing(tmp_path):
    with open_lab(tmp_path, "fl-new-", bird=False) as lab:
        # what a later release with an incompatible migration leaves: schema 3, usable by 3 and later,
        # and the copy of schema 2 it made before migrating
        SyncStore.open(lab.state_dir).close()
        SyncStore.open(lab.state_dir, migrations=(*MIGRATIONS, lambda conn: None)).close()
        db = lab.state_dir / FILENAME
        backup = backup_path(db, 2)
        assert backup.exists()
        before = db.read_bytes()
        nft_before = lab.node.run("nft", "list", "ruleset").stdout
        routes_before = lab.node.ip("-6", "route") + lab.node.ip("-4", "route")

        agent = lab.agent()
        status, body = wait_for("/readyz to answer", lambda: (r := agent.get("/readyz"))[0] != 0 and r, 30)
        assert status == 503, body
        for part in ("schema version 3", "knows up to 2", "flock-agent", "Upgrading", str(backup)):
            assert part in body, (part, body)
        assert "flock_store_too_new 1.0" in agent.get("/metrics")[1]
        lab.api.create(PODS, pod_object("default", "web-0", "host001"))
        pod = lab.pool.create("web")
        for op, code in (("ADD", 11), ("DEL", 11), ("CHECK", 11), ("STATUS", 50)):
            out = lab.cni(op, "c0ffee01", pod, "web-0", **({"prevResult": {}} if op == "CHECK" else {}))
            assert (out.status, out.code) == (1, code), (op, out)
            assert "schema version 3" in out.json["details"] and len(out.stdout) < 4096, out
        assert any("newer flock" in r.get("msg", "") for r in agent.records())
        assert agent.stop() == 0
        # nothing touched: the file (and no WAL files beside it), the node's routes, nftables
        assert db.read_bytes() == before and not db.with_name(FILENAME + "-wal").exists()
        assert lab.node.ip("-6", "route") + lab.node.ip("-4", "route") == routes_before
        assert lab.node.run("nft", "list", "ruleset").stdout == nft_before
        assert "eth0" not in pod.ip("-o", "link")

        # the rollback the message names: the backup put back; the agent serves again
        db.unlink()
        backup.rename(db)
        agent = lab.agent()
        agent.wait_ready()
        assert lab.cni("ADD", "c0ffee01", pod, "web-0").status == 0
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT value FROM flock_meta WHERE key = 'schema'").fetchone()[0] == 2
