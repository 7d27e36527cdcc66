"""flock-lab end to end: real namespaces, bird2, API server, agents and the installed shim.

One lab per test run (module fixture would outlive a trio test's deadline, so
the one lifecycle test does it all in order); the pure helpers are tested alone.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from flock.lab import (
    CniParams,
    LabError,
    LabPlan,
    down,
    exec_conflist,
    load_conflist,
    load_pods,
    pod_add,
    pod_check,
    pod_del,
    reachability,
    status_text,
    summary,
    up,
)
from flock.lab._bird import parse_protocols
from flock.lab._check import matrix_text, wait_anycast_routes
from flock.lab._lifecycle import lab_namespaces
from flock.lab._pods import CniFailure, parse_annotations, parse_pod_key
from flock.lab._procs import is_running, proc_ref
from flock.lab._state import load_procs, load_state, process_refs
from flock.lab.keeper import Keeper, ProcessSpec

ANYCAST = "2001:db8:53::53,192.0.2.153"

BIRDC_OUTPUT = """\
BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     20:32:50.705
node1      BGP        ---        up     20:33:26.224  Established
node2      BGP        ---        start  2026-11-20 20:32:50  Active        Socket: Connection refused
"""


def test_parse_protocols_reads_bgp_rows_only() -> None:
    sessions = parse_protocols(BIRDC_OUTPUT)
    assert [(s.name, s.state, s.info, s.established) for s in sessions] == [
        ("node1", "up", "Established", True),
        ("node2", "start", "Active Socket: Connection refused", False),
    ]


def test_plan_uses_documentation_ranges_and_lab_prefixed_namespaces(tmp_path: Path) -> None:
    plan = LabPlan.make(tmp_path, 8)
    assert [str(n.cidr4) for n in plan.nodes[3:5]] == ["198.51.100.192/26", "203.0.113.0/26"]
    assert [str(n.addr6) for n in plan.nodes[:2]] == ["2001:db8:ffff::101", "2001:db8:ffff::102"]
    assert all(n.netns.startswith(f"flab-{plan.id}-") for n in plan.nodes) and plan.fabric_netns.startswith("flab-")
    with pytest.raises(ValueError, match=r"--nodes 9: expected 1\.\.8"):
        LabPlan.make(tmp_path, 9)


def test_a_pod_deleted_while_the_pods_are_read_is_gone_not_an_error(tmp_path: Path) -> None:
    # a probe reads the pods while `pod del` removes one (the services stage's drain): the glob finds
    # the file, the read does not — here, deterministically, a cache entry that points nowhere
    plan = LabPlan.make(tmp_path, 1)
    plan.pods_dir.mkdir(parents=True)
    (plan.pods_dir / "shop_gone.json").symlink_to(tmp_path / "deleted.json")
    assert load_pods(plan) == []


def test_pod_keys_and_annotations_are_checked() -> None:
    assert parse_pod_key("default/web-1") == ("default", "web-1")
    assert parse_annotations(["ipv4=true", "example.com/x=a=b"]) == {
        "flock.fritzlab.net/ipv4": "true",
        "example.com/x": "a=b",
    }
    for bad in ("web-1", "Default/web", "default/"):
        with pytest.raises(LabError, match="NAMESPACE/NAME"):
            parse_pod_key(bad)
    with pytest.raises(LabError, match="KEY=VALUE"):
        parse_annotations(["ipv4"])


def _leftovers(directory: Path, ident: str, pids: list[int]) -> list[str]:
    out = [f"namespace {n}" for n in lab_namespaces(ident)]
    out += [f"process {pid}" for pid in pids if (ref := proc_ref(pid)) is not None and is_running(ref)]
    if directory.exists() and any(directory.iterdir()):  # the test made the directory itself
        out.append(f"files {sorted(p.name for p in directory.iterdir())}")
    return out


async def test_lab_up_pods_check_crash_and_down(require_root: None, require_bird: None) -> None:
    # Unix socket paths hold at most 108 bytes: a short directory of our own.
    directory = Path(tempfile.mkdtemp(prefix="flab-t-"))
    plan = LabPlan.make(directory, 2)
    pids: list[int] = []
    try:
        with trio.fail_after(50):
            state = await up(plan)
            assert state.phase == "up" and load_state(directory) == state
            pids = [state.keeper.pid, *(r.pid for r in process_refs(directory).values())]
            # keeper, API server, the lab's controllers, flock-controller, fabric bird, and per node: bird, agent,
            # its port server
            assert len(pids) == 1 + 1 + 1 + 1 + 1 + 2 * 3

            dual1 = await pod_add(plan, "node1", "default/dual-1", parse_annotations(["ipv4=true"]))
            await pod_add(plan, "node2", "default/v6-2", {})
            await pod_add(plan, "node1", "dns/r-1", parse_annotations(["ipv4=true", f"anycast={ANYCAST}"]))
            await pod_add(
                plan,
                "node2",
                "dns/r-2",
                parse_annotations(["ipv4=true", f"anycast={ANYCAST}"]),
                owner="ReplicaSet/r-5f6d",
            )
            assert dual1.addresses(6)[0].startswith("2001:db8:0:1:") and dual1.addresses(4)[0].startswith("198.51.100.")
            with pytest.raises(LabError, match="exists already"):
                await pod_add(plan, "node1", "default/dual-1", {})
            with pytest.raises(CniFailure, match="CNI error 7") as bad:
                await pod_add(plan, "node1", "default/bad", parse_annotations(["cidr6=2001:db8:0:99::/64"]))
            assert "cidr6" in json.dumps(bad.value.error)
            assert not (plan.pods_dir / "default_bad.json").exists() and len(lab_namespaces(plan.id)) == 3 + 4

            pods = load_pods(plan)
            await wait_anycast_routes(plan, pods)
            probes = await reachability(plan, pods)
            result = summary(probes)
            assert result["ok"], matrix_text(pods, probes)
            # 4 pods: 12 ordered pairs over IPv6, 6 over IPv4 (among the 3 dual-stack pods), 2 anycast x 2 nodes.
            assert result["probes"] == 12 + 6 + 4
            assert "22/22 probes passed" in matrix_text(pods, probes)

            await pod_check(plan, "default/dual-1")
            await pod_del(plan, "dns/r-2")
            with pytest.raises(LabError, match="no pod dns/r-2"):
                await pod_check(plan, "dns/r-2")
            # node2 has no member of the anycast service now: it reaches node1's over BGP.
            pods = load_pods(plan)
            await wait_anycast_routes(plan, pods)
            probes = await reachability(plan, pods)
            assert summary(probes)["ok"], matrix_text(pods, probes)
            assert {(p.source, p.address) for p in probes if p.target == "anycast"} == {
                (node, addr) for node in ("node1", "node2") for addr in ANYCAST.split(",")
            }

            # A crashed lab (keeper killed, its children left running) is cleaned by the next up.
            os.kill(state.keeper.pid, signal.SIGKILL)
            # Another process, not our child: nothing to wait on.
            while is_running(state.keeper):  # noqa: ASYNC110
                await trio.sleep(0.01)
            state = await up(plan)
            pids += [state.keeper.pid, *(r.pid for r in process_refs(directory).values())]
            assert load_pods(plan) == [] and len(lab_namespaces(plan.id)) == 3
            with pytest.raises(LabError, match="a lab is running in"):
                await up(plan)  # a running lab is never torn down by up

            # An attachment the lab did not make (a runtime's container without a pod, as podman
            # attaches it through the node's conflist) is listed by status too.
            outside = f"fl-out-{plan.id}"
            await trio.run_process(["ip", "netns", "add", outside])
            node1 = plan.nodes[0]
            conflist = load_conflist(node1.cni_conf)
            att = CniParams("c0ffee0ut", f"/run/netns/{outside}", "eth0", "IgnoreUnknown=1;K8S_POD_NAME=app_1")
            try:
                added = await exec_conflist(node1.netns, str(node1.cni_bin), conflist, "ADD", att)
                assert added.ok, added
                # The CLI on the same lab: status as JSON.
                cli = await trio.run_process(
                    [sys.executable, "-m", "flock.lab.cli", "status", "--json", "--dir", str(directory)],
                    capture_stdout=True,
                    capture_stderr=True,
                )
                doc = json.loads(cli.stdout)
                assert [n["agent"]["ready"] for n in doc["nodes"]] == [True, True]
                assert [s["established"] for n in doc["nodes"] for s in n["bgp"]] == [True, True]
                (held,) = doc["attachments"]
                assert (held["node"], held["made_by"], held["pod"], held["label"]) == (
                    "node1",
                    "runtime",
                    None,
                    "app_1",
                )
                assert held["ipv6"] == [added.json["ips"][0]["address"].split("/")[0]]
                assert "container app_1  node1   runtime" in status_text(doc)
                assert (await exec_conflist(node1.netns, str(node1.cni_bin), conflist, "DEL", att)).ok
            finally:
                await trio.run_process(["ip", "netns", "del", outside], check=False)

            await down(directory)
            assert _leftovers(directory, plan.id, pids) == []
            assert (await down(directory))["namespaces"] == []  # twice is fine
    finally:
        with trio.move_on_after(30, shield=True):
            await down(directory)
            await trio.run_process(["rm", "-rf", "--", str(directory)], check=False)
    assert load_procs(directory) == {}


async def test_keeper_restarts_what_exits_and_stops_everything(tmp_path: Path) -> None:
    ignores_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    specs = (
        ProcessSpec("steady", ("sleep", "60"), tmp_path / "steady.log"),
        ProcessSpec("crashes", ("sh", "-c", "echo crash; exit 3"), tmp_path / "crashes.log"),
        ProcessSpec("stubborn", (sys.executable, "-c", ignores_term), tmp_path / "stubborn.log"),
    )
    keeper = Keeper(specs, tmp_path / "procs.json", stop_grace=0.5)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            stubborn_log = trio.Path(tmp_path / "stubborn.log")
            # A child process's output: nothing in this process to wait on.
            while keeper.restarts["crashes"] < 1 or "up" not in await stubborn_log.read_text():  # noqa: ASYNC110
                await trio.sleep(0.05)
            status = json.loads((tmp_path / "procs.json").read_text())
            pids = {name: p["pid"] for name, p in status["processes"].items()}
            assert status["processes"]["steady"]["running"] and status["processes"]["steady"]["restarts"] == 0
            keeper.request_stop()
    status = json.loads((tmp_path / "procs.json").read_text())
    assert status["stopping"] and not any(p["running"] for p in status["processes"].values())
    for pid in pids.values():  # reaped: not even a zombie is left
        assert proc_ref(pid) is None
    assert (tmp_path / "crashes.log").read_text().count("crash") >= 2


async def test_demo_command_passes_and_leaves_nothing(require_root: None, require_bird: None) -> None:
    """README's first command (after bootstrap): `flock-lab demo`, here with --json."""
    directory = Path(tempfile.mkdtemp(prefix="flab-d-"))
    try:
        with trio.fail_after(50):
            proc = await trio.run_process(
                [sys.executable, "-m", "flock.lab.cli", "demo", "--json", "--dir", str(directory)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        doc = json.loads(proc.stdout)
        assert doc["check"]["ok"] and doc["check"]["failed"] == []
        results = {p["pod"]: p["result"] for p in doc["pods"]}
        v4 = [k for k, r in results.items() if any(":" not in ip["address"] for ip in r["ips"])]
        assert sorted(v4) == ["default/dual-1", "default/dual-2", "dns/resolver-1", "dns/resolver-2"]
        assert results["batch/job-1"]["ips"][0]["address"].startswith("2001:db8:0:2:ba7c:")
        carts = [
            ipaddress.IPv6Interface(r["ips"][0]["address"]).ip for k, r in results.items() if k.startswith("shop/")
        ]
        # ip-algo namespace:16,app:16: both replicas share the top 32 bits of the interface identifier.
        assert len(carts) == 2 and len({(int(a) >> 32) & 0xFFFFFFFF for a in carts}) == 1
        assert doc["down"]["namespaces"] and _leftovers(directory, LabPlan.make(directory, 2).id, []) == []
    finally:
        with trio.move_on_after(30, shield=True):
            await down(directory)
            await trio.run_process(["rm", "-rf", "--", str(directory)], check=False)
