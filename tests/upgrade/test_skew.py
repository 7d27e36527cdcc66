"""Version skew, both ways, with the previous release's own code (flock.testing.releases: checked out of
git history, never imitated): its shim file as its installer writes it on a host, against this agent, and
this shim against its agent, for ADD, CHECK, STATUS, DEL and GC; a DEL that finds no agent during the swap
(either shim's journal) replayed by the next agent of either release; allocations kept across an upgrade
and a rollback (addresses, MACs, hostPorts, the network).  And the shim's wire v1 fallback, against the
last agent that spoke only v1 (the previous release speaks v2, as this one).

One node in namespaces (flock.testing.agentlab) without BIRD: the subject is the shim, the agent and their
shared state (store, journal, kernel), not routing."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import marshal
import os
import sqlite3
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flock.apiserver import PODS, pod_object
from flock.model import DEFAULT_NETWORK, PortMapping
from flock.store import FILENAME
from flock.testing.agentlab import BIN, NODE, AgentProcess, Lab, open_lab
from flock.testing.netns import Netns
from flock.testing.releases import (
    PREVIOUS_RELEASE,
    WIRE_V1_AGENT,
    MissingRelease,
    agent_runner,
    build_shim,
    checkout,
)
from flock.testing.shimrun import Outcome

pytestmark = pytest.mark.usefixtures("require_root")
A = "flock.fritzlab.net/"
LAB_NETWORK = "flock-net"  # the name in Lab.cni's configuration
OTHER_NETWORK = "flock-podman"  # a second network of the same agent (the installer's --podman-network)


# -- fixtures --------------------------------------------------------------------------------------


def _checkout(ref: str, dest: Path) -> Path:
    try:
        return checkout(ref, dest)
    except MissingRelease as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """flock 0.1.0's package (store schema v1, wire v2), from git history."""
    return _checkout(PREVIOUS_RELEASE, tmp_path_factory.mktemp("previous-release"))


@pytest.fixture(scope="module")
def wire_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last flock whose agent spoke wire v1 only, from git history."""
    return _checkout(WIRE_V1_AGENT, tmp_path_factory.mktemp("wire-v1"))


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with open_lab(tmp_path, "fl-skew-", bird=False) as lab:
        yield lab


@pytest.fixture
def old_shim(previous: Path, lab: Lab) -> list[str]:
    """The previous release's shim file, written by its own installer code, journaling where the lab's
    (this release's) shim does: ``<socket dir>/pending-deletes``."""
    try:
        argv = build_shim(previous, lab.tmp / "old-shim", pending_deletes=str(lab.socket.parent / "pending-deletes"))
    except MissingRelease as exc:
        pytest.fail(str(exc))
    # It is that release's bundle (its shim modules, byte for byte), not this one's.
    shim_module = _bundled_modules(argv[0])["flock.cni_shim"]
    assert shim_module == (previous / "flock" / "cni_shim.py").read_text()
    assert shim_module != _bundled_modules(lab.plugin[0])["flock.cni_shim"]
    return argv


# -- helpers ---------------------------------------------------------------------------------------


def _bundled_modules(shim: str) -> dict[str, str]:
    """Name -> source of the modules embedded in a shim file (its ``_BUNDLE``: base64 of zlib of marshal)."""
    for line in Path(shim).read_text().splitlines():
        if line.startswith('_BUNDLE = "'):
            return marshal.loads(zlib.decompress(base64.b64decode(line[11:-1])))["modules"]
    raise AssertionError(f"{shim}: no _BUNDLE line")


def cni(lab: Lab, plugin: list[str], command: str, *args: Any, **kwargs: Any) -> Outcome:
    """``lab.cni`` through *plugin* (a shim's argv) instead of the lab's own shim."""
    saved, lab.plugin = lab.plugin, plugin
    try:
        return lab.cni(command, *args, **kwargs)
    finally:
        lab.plugin = saved


def ok(outcome: Outcome) -> Outcome:
    assert outcome.status == 0, outcome
    return outcome


def pods(lab: Lab, *names: str) -> list[Netns]:
    """Pods *names* in the API (dual-stack: IPv6 and IPv4) and a namespace for each."""
    out = []
    for name in names:
        lab.api.create(PODS, pod_object("default", name, NODE, annotations={A + "ipv4": "true"}))
        out.append(lab.pool.create(name.replace("-", "")))
    return out


def _mac(ns: Netns, dev: str) -> str:
    return json.loads(ns.ip("-j", "link", "show", "dev", dev))[0]["address"]


def assert_dual_stack_with_kernel_macs(lab: Lab, result: dict, ns: Netns) -> None:
    """An ADD result as this release gives it: IPv6 then IPv4 on the pod's eth0, the host veth and the
    pod's eth0 with the MACs the kernel gave them."""
    assert shape(result) == {
        "keys": ["cniVersion", "interfaces", "ips", "routes"],
        "cniVersion": "1.1.0",
        "interfaces": [["mac", "name"], ["mac", "name", "sandbox"]],
        "ips": [(6, 128, "fe80::1", 1), (4, 32, "169.254.1.1", 1)],
        "routes": [{"dst": "::/0", "gw": "fe80::1"}, {"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
    }, result
    host, pod = result["interfaces"]
    assert host["mac"] == _mac(lab.node, host["name"]) and host["name"].startswith("flock")
    assert (pod["name"], pod["mac"], pod["sandbox"]) == ("eth0", _mac(ns, "eth0"), ns.path)


def shape(result: dict) -> dict:
    """An ADD result without what differs between pods (addresses, names, MACs)."""
    return {
        "keys": sorted(result),
        "cniVersion": result.get("cniVersion"),
        "interfaces": [sorted(i) for i in result.get("interfaces", [])],
        "ips": [
            (
                ipaddress.ip_interface(ip["address"]).version,
                ipaddress.ip_interface(ip["address"]).network.prefixlen,
                ip.get("gateway"),
                ip.get("interface"),
            )
            for ip in result.get("ips", [])
        ],
        "routes": result.get("routes"),
    }


def addresses(result: dict) -> set[str]:
    return {ip["address"].split("/")[0] for ip in result["ips"]}


def stored(lab: Lab) -> dict[str, dict[str, Any]]:
    """The allocation rows, read-only (no migration, whatever the schema: also while an older agent
    owns the file)."""
    uri = f"file:{lab.state_dir / FILENAME}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        return {row["container_id"]: dict(row) for row in conn.execute("SELECT * FROM allocations")}


def journal(lab: Lab) -> dict[str, dict]:
    """The DELs the shims journaled (``<socket dir>/pending-deletes/<containerID>.json``)."""
    directory = lab.socket.parent / "pending-deletes"
    if not directory.exists():
        return {}
    return {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in directory.glob("*.json")}


def agent_version(lab: Lab) -> str:
    """What the running agent says it is (``flockctl status`` over its admin socket)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    done = subprocess.run(
        [str(BIN / "flockctl"), "status", "--json", "--socket", str(lab.socket.parent / "admin.sock")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done
    return json.loads(done.stdout)["agent"]["version"]


def start(lab: Lab, release: Path | None = None) -> AgentProcess:
    """This release's agent (*release* None) or *release*'s, on the lab's state dir, ready."""
    try:
        prefix = agent_runner(release) if release is not None else []
    except MissingRelease as exc:
        pytest.fail(str(exc))
    agent = lab.agent(prefix=prefix)
    agent.wait_ready()
    return agent


def host_ports(lab: Lab) -> set[int]:
    """The host ports in flock's hostPort maps (this release's ``hp-*`` maps of ``inet flock``)."""
    done = lab.node.run("nft", "-j", "list", "table", "inet", "flock", check=False)
    if done.returncode != 0:
        return set()
    ports = set()
    for item in json.loads(done.stdout)["nftables"]:
        found = item.get("map", {})
        if not found.get("name", "").startswith("hp-"):
            continue
        for key, _ in found.get("elem", []):
            parts = key["concat"] if isinstance(key, dict) else [key]
            ports.update(p for p in parts if isinstance(p, int))
    return ports


def _ports(host_port: int, container_port: int) -> dict:
    return {"runtimeConfig": {"portMappings": [{"hostPort": host_port, "containerPort": container_port}]}}


def _wrong_mac(result: dict) -> dict:
    pod = result["interfaces"][1]
    other = "02:00:00:00:00:01" if pod["mac"] != "02:00:00:00:00:01" else "02:00:00:00:00:02"
    return {**result, "interfaces": [result["interfaces"][0], {**pod, "mac": other}]}


def _valid(*container_ids: str) -> dict:
    return {"cni.dev/valid-attachments": [{"containerID": c, "ifname": "eth0"} for c in container_ids]}


# -- a. the previous release's shim against this agent -----------------------------------------------


def test_the_previous_releases_shim_against_this_agent(lab: Lab, old_shim: list[str]) -> None:
    new_shim = lab.plugin
    agent = start(lab)
    assert agent_version(lab) == "0.2.0"
    web0, web1, gone0, other0 = pods(lab, "web-0", "web-1", "gone-0", "other-0")

    # ADD: the old shim prints what this shim prints, MACs from the kernel included.
    old_add = ok(cni(lab, old_shim, "ADD", "c0ffee01", web0, "web-0")).json
    new_add = ok(lab.cni("ADD", "c0ffee02", web1, "web-1")).json
    assert_dual_stack_with_kernel_macs(lab, old_add, web0)
    assert_dual_stack_with_kernel_macs(lab, new_add, web1)
    assert ok(lab.cni("ADD", "c0ffee01", web0, "web-0")).json == old_add  # the same pod through this shim
    rows = lab.rows()
    assert rows["c0ffee01"].network == LAB_NETWORK  # the conflist name the old shim forwarded
    assert {str(rows["c0ffee01"].ip6), str(rows["c0ffee01"].ip4)} == addresses(old_add)

    # CHECK with the ADD's result as prevResult; a wrong MAC is refused the same way through either shim.
    for plugin in (old_shim, new_shim):
        assert ok(cni(lab, plugin, "CHECK", "c0ffee01", web0, "web-0", prevResult=old_add)).stdout == ""
    wrong = [
        cni(lab, p, "CHECK", "c0ffee01", web0, "web-0", prevResult=_wrong_mac(old_add)) for p in (old_shim, new_shim)
    ]
    assert wrong[0] == wrong[1] and (wrong[0].status, wrong[0].code) == (1, 120), wrong

    # STATUS
    assert ok(cni(lab, old_shim, "STATUS")) == ok(lab.cni("STATUS"))

    # DEL (twice: idempotent); only that pod's veth and row go.
    for _ in range(2):
        assert ok(cni(lab, old_shim, "DEL", "c0ffee01", web0, "web-0")).stdout == ""
    assert set(lab.rows()) == {"c0ffee02"}
    assert lab.flock_links() == {new_add["interfaces"][0]["name"]}
    assert "eth0" not in web0.ip("-o", "link")

    # GC for the lab's network keeps the valid attachment and another network's, removes the rest.
    ok(cni(lab, old_shim, "ADD", "c0ffee03", gone0, "gone-0"))
    # (a hostPort through the old shim too: the configuration it forwards carries runtimeConfig)
    ok(cni(lab, old_shim, "ADD", "c0ffee04", other0, "other-0", name=OTHER_NETWORK, **_ports(8080, 80)))
    assert {a.network for a in lab.rows().values()} == {LAB_NETWORK, OTHER_NETWORK}
    assert lab.rows()["c0ffee04"].port_mappings == (PortMapping(8080, 80),) and host_ports(lab) == {8080}
    assert ok(cni(lab, old_shim, "GC", **_valid("c0ffee02"))).stdout == ""
    assert {c: a.network for c, a in lab.rows().items()} == {"c0ffee02": LAB_NETWORK, "c0ffee04": OTHER_NETWORK}
    assert len(lab.flock_links()) == 2 and "eth0" not in gone0.ip("-o", "link")
    assert agent.stop() == 0


# -- b. this shim against the previous release's agent -----------------------------------------------


def test_this_shim_against_the_previous_releases_agent(lab: Lab, previous: Path, old_shim: list[str]) -> None:
    new_shim = lab.plugin
    agent = start(lab, previous)
    assert agent_version(lab) == "0.1.0"
    web0, web1, gone0 = pods(lab, "web-0", "web-1", "gone-0")

    # ADD: what that release's own shim gets from its agent, MACs included.
    add = ok(lab.cni("ADD", "c0ffee01", web0, "web-0")).json
    assert_dual_stack_with_kernel_macs(lab, add, web0)
    assert ok(cni(lab, old_shim, "ADD", "c0ffee01", web0, "web-0")).json == add
    row = stored(lab)["c0ffee01"]
    assert {row["ip6"], row["ip4"]} == addresses(add)

    # CHECK, and the same refusal as through that release's shim.
    assert ok(lab.cni("CHECK", "c0ffee01", web0, "web-0", prevResult=add)).stdout == ""
    wrong = [cni(lab, p, "CHECK", "c0ffee01", web0, "web-0", prevResult=_wrong_mac(add)) for p in (new_shim, old_shim)]
    assert wrong[0] == wrong[1] and (wrong[0].status, wrong[0].code) == (1, 120), wrong

    # STATUS
    assert ok(lab.cni("STATUS")) == ok(cni(lab, old_shim, "STATUS"))

    # DEL, twice.
    for _ in range(2):
        assert ok(lab.cni("DEL", "c0ffee01", web0, "web-0")).stdout == ""
    assert stored(lab) == {} and lab.flock_links() == set() and lab.flock_routes() == []

    # GC
    kept = ok(lab.cni("ADD", "c0ffee02", web1, "web-1")).json
    ok(lab.cni("ADD", "c0ffee03", gone0, "gone-0"))
    assert ok(lab.cni("GC", **_valid("c0ffee02"))).stdout == ""
    assert set(stored(lab)) == {"c0ffee02"} and lab.flock_links() == {kept["interfaces"][0]["name"]}

    # Both speak wire v2: no request was refused for its version.
    assert not [r for r in agent.records() if r.get("msg") == "bad request"], agent.log.read_text()[-3000:]
    assert agent.stop() == 0


# -- c. DELs during the swap: journaled by either shim, replayed by the next agent of either release ---


def test_dels_journaled_during_an_upgrade_and_a_rollback_are_replayed(
    lab: Lab, previous: Path, old_shim: list[str]
) -> None:
    web0, web1, web2, web3, web4, web5 = pods(lab, "web-0", "web-1", "web-2", "web-3", "web-4", "web-5")

    # The upgrade: the previous release's agent and shim on the node, two pods.
    old = start(lab, previous)
    first = [ok(cni(lab, old_shim, "ADD", cid, ns, pod)).json for cid, ns, pod in
             (("c0ffee01", web0, "web-0"), ("c0ffee02", web1, "web-1"))]  # fmt: skip
    assert old.stop() == 0  # its pod is replaced: SIGTERM
    # The runtime tears both pods down meanwhile: one DEL through the old shim (still on the host), one
    # through the new (the new pod's init container has installed it; its agent is not up yet).
    assert ok(cni(lab, old_shim, "DEL", "c0ffee01", web0, "web-0")).stdout == ""
    assert ok(lab.cni("DEL", "c0ffee02", web1, "web-1")).stdout == ""
    queued = journal(lab)
    assert set(queued) == {"c0ffee01", "c0ffee02"}
    assert all((r["op"], r["version"], r["containerID"]) == ("DEL", 1, c) for c, r in queued.items()), queued
    assert len(lab.flock_links()) == 2 and set(stored(lab)) == {"c0ffee01", "c0ffee02"}  # nothing applied yet

    new = start(lab)  # on the same state dir: replays both before it is ready
    assert journal(lab) == {}
    assert lab.rows() == {} and lab.flock_links() == set() and lab.flock_routes() == []
    # The addresses are free again: the next pods get the IPv4 addresses (lowest free) the DEL'd had.
    again = [ok(lab.cni("ADD", cid, ns, pod)).json for cid, ns, pod in
             (("c0ffee03", web2, "web-2"), ("c0ffee04", web3, "web-3"))]  # fmt: skip
    v4 = {a for r in first for a in addresses(r) if "." in a}
    assert {a for r in again for a in addresses(r) if "." in a} == v4 and len(v4) == 2

    # The rollback: this agent goes, the runtime DELs through this shim, then through the old one
    # (the previous release's init container has put it back), and the previous agent replays both.
    assert new.stop() == 0
    assert ok(lab.cni("DEL", "c0ffee03", web2, "web-2")).stdout == ""
    assert ok(cni(lab, old_shim, "DEL", "c0ffee04", web3, "web-3")).stdout == ""
    assert set(journal(lab)) == {"c0ffee03", "c0ffee04"}
    old = start(lab, previous)
    assert journal(lab) == {}
    assert stored(lab) == {} and lab.flock_links() == set() and lab.flock_routes() == []
    back = [ok(cni(lab, old_shim, "ADD", cid, ns, pod)).json for cid, ns, pod in
            (("c0ffee05", web4, "web-4"), ("c0ffee06", web5, "web-5"))]  # fmt: skip
    assert {a for r in back for a in addresses(r) if "." in a} == v4
    assert old.stop() == 0


# -- d. the store across the swap: an upgrade, a rollback, and forward again -------------------------


def test_allocations_survive_an_upgrade_and_a_rollback(lab: Lab, previous: Path, old_shim: list[str]) -> None:
    # The installer's default network name throughout (what the migration gives the previous release's rows).
    main = {"name": DEFAULT_NETWORK}
    web0, web1, web2, web3 = pods(lab, "web-0", "web-1", "web-2", "web-3")

    old = start(lab, previous)
    r1 = ok(cni(lab, old_shim, "ADD", "c0ffee01", web0, "web-0", **main)).json
    assert old.stop() == 0

    # Upgrade: the previous agent's allocation is this agent's, unchanged (addresses, MACs); CHECK passes.
    new = start(lab)
    rows = lab.rows()
    assert set(rows) == {"c0ffee01"} and rows["c0ffee01"].network == DEFAULT_NETWORK
    assert {str(rows["c0ffee01"].ip6), str(rows["c0ffee01"].ip4)} == addresses(r1)
    assert ok(lab.cni("CHECK", "c0ffee01", web0, "web-0", prevResult=r1, **main)).stdout == ""
    assert ok(lab.cni("ADD", "c0ffee01", web0, "web-0", **main)).json == r1
    assert_dual_stack_with_kernel_macs(lab, r1, web0)
    # What only this release has: hostPorts, and attachments of a second network.
    r2 = ok(lab.cni("ADD", "c0ffee02", web1, "web-1", **main, **_ports(8080, 80))).json
    r3 = ok(lab.cni("ADD", "c0ffee03", web2, "web-2", name=OTHER_NETWORK)).json
    r4 = ok(lab.cni("ADD", "c0ffee04", web3, "web-3", **main, **_ports(9090, 80))).json
    assert host_ports(lab) == {8080, 9090}
    assert new.stop() == 0

    # Rollback: the previous agent (and its shim) on this release's database.
    old = start(lab, previous)
    rows_v2 = stored(lab)
    assert set(rows_v2) == {"c0ffee01", "c0ffee02", "c0ffee03", "c0ffee04"}
    assert {c: r["network"] for c, r in rows_v2.items()} == {
        "c0ffee01": DEFAULT_NETWORK,
        "c0ffee02": DEFAULT_NETWORK,
        "c0ffee03": OTHER_NETWORK,
        "c0ffee04": DEFAULT_NETWORK,
    }
    for cid, ns, pod, result, conf in (
        ("c0ffee01", web0, "web-0", r1, main),
        ("c0ffee02", web1, "web-1", r2, main),
        ("c0ffee03", web2, "web-2", r3, {"name": OTHER_NETWORK}),
        ("c0ffee04", web3, "web-3", r4, main),
    ):
        assert ok(cni(lab, old_shim, "CHECK", cid, ns, pod, prevResult=result, **conf)).stdout == "", cid
        assert ok(cni(lab, old_shim, "ADD", cid, ns, pod, **conf)).json == result, cid
    # docs/upgrading.md, "Rollback": 0.1.0 does not know hostPorts; they stop answering until the upgrade is redone.
    assert host_ports(lab) == set()
    # DEL through the previous release: the hostPort pod and the other network's.
    assert ok(cni(lab, old_shim, "DEL", "c0ffee02", web1, "web-1", **main)).stdout == ""
    assert ok(cni(lab, old_shim, "DEL", "c0ffee03", web2, "web-2", name=OTHER_NETWORK)).stdout == ""
    assert set(stored(lab)) == {"c0ffee01", "c0ffee04"}
    assert lab.flock_links() == {r1["interfaces"][0]["name"], r4["interfaces"][0]["name"]}
    assert old.stop() == 0

    # Forward again: what the previous release could not know (network, hostPorts) survived it.
    new = start(lab)
    rows = lab.rows()
    assert set(rows) == {"c0ffee01", "c0ffee04"}
    assert rows["c0ffee04"].port_mappings == (PortMapping(9090, 80),) and rows["c0ffee04"].network == DEFAULT_NETWORK
    assert host_ports(lab) == {9090}
    for cid, ns, pod, result in (("c0ffee01", web0, "web-0", r1), ("c0ffee04", web3, "web-3", r4)):
        assert ok(lab.cni("CHECK", cid, ns, pod, prevResult=result, **main)).stdout == "", cid
    assert new.stop() == 0


# -- the shim's wire v1 fallback -------------------------------------------------------------------


def host_veths(lab: Lab) -> set[str]:
    """flock's host veths on the node now (without waiting on the agent's removals)."""
    names = (line.split(":")[1].strip().split("@")[0] for line in lab.node.ip("-o", "link", "show").splitlines())
    return {name for name in names if name.startswith("flock")}


def test_this_shim_falls_back_to_wire_v1_for_an_agent_that_speaks_only_v1(lab: Lab, wire_v1: Path) -> None:
    """Against the last agent that spoke only v1: each request is refused for its version (code 202),
    then sent again as v1 (the netns by path) and served; a DEL journaled while that agent was away (a v1
    record) is replayed by it.  That agent removes a veth before DEL answers and has no
    ``flock_veth_removals_pending`` (what ``Lab.flock_links`` waits on): the node's links are read as they are."""
    web0, web1, gone0, web2 = pods(lab, "web-0", "web-1", "gone-0", "web-2")
    agent = start(lab, wire_v1)

    add = ok(lab.cni("ADD", "c0ffee01", web0, "web-0")).json
    # That agent's result: no MACs yet, the rest as now.
    assert shape(add)["ips"] == [(6, 128, "fe80::1", 1), (4, 32, "169.254.1.1", 1)], add
    assert [sorted(i) for i in add["interfaces"]] == [["name"], ["name", "sandbox"]]
    assert add["interfaces"][1]["sandbox"] == web0.path and "eth0" in web0.ip("-o", "link")
    assert ok(lab.cni("CHECK", "c0ffee01", web0, "web-0", prevResult=add)).stdout == ""
    assert ok(lab.cni("STATUS")).stdout == ""
    for _ in range(2):
        assert ok(lab.cni("DEL", "c0ffee01", web0, "web-0")).stdout == ""
    assert host_veths(lab) == set()
    kept = ok(lab.cni("ADD", "c0ffee02", web1, "web-1")).json
    ok(lab.cni("ADD", "c0ffee03", gone0, "gone-0"))
    assert ok(lab.cni("GC", **_valid("c0ffee02"))).stdout == ""
    assert host_veths(lab) == {kept["interfaces"][0]["name"]} and "eth0" not in gone0.ip("-o", "link")

    records = agent.records()
    refused = [r for r in records if r.get("msg") == "bad request"]
    served = [(r["op"], r["code"]) for r in records if r.get("msg") == "request served"]
    assert served == [
        ("ADD", 0),
        ("CHECK", 0),
        ("STATUS", 0),
        ("DEL", 0),
        ("DEL", 0),
        ("ADD", 0),
        ("ADD", 0),
        ("GC", 0),
    ]
    assert len(refused) == len(served) and all(
        r["code"] == 202 and "request has version=2; this agent speaks versions 1" in r["error"] for r in refused
    ), refused

    # A DEL while it is away: journaled (as v1), replayed when it is back.
    ok(lab.cni("ADD", "c0ffee04", web2, "web-2"))
    assert agent.stop() == 0
    assert ok(lab.cni("DEL", "c0ffee04", web2, "web-2")).stdout == ""
    assert journal(lab)["c0ffee04"]["version"] == 1
    assert start(lab, wire_v1).stop() == 0  # it replays the journal before it is ready
    assert journal(lab) == {} and host_veths(lab) == {kept["interfaces"][0]["name"]}
