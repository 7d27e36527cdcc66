"""flockctl's pure parts (pool arithmetic, birdc parsing, the API cross-check)
and the admin socket's handling of bad input, in process on a real unix socket."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from typing import Any

import attrs
import pytest
import trio

from flock.apiserver import cluster_network_policy_object, nodeconfig_object, pod_object
from flock.ctl import ADMIN_PROTOCOL_VERSION, AdminOps, AdminServer
from flock.ctl._apicheck import cross_check
from flock.ctl._cli import encryption_lines, policy_lines
from flock.ctl._ops import OpRefused, parse_bgp_sessions, parse_prefixes, policy_watch_view
from flock.ctl._pools import free_ranges, pool_report
from flock.model import Allocation, AllocationState, NodeConfig
from flock.netlink import NetlinkWorker
from flock.pods import PodHandler
from flock.policy import ClusterNetworkPolicy
from flock.state import NodeState
from flock.testing.pods import MemoryAllocations, MemoryKernel

NODE = "host001"
CONFIG = NodeConfig.from_object(nodeconfig_object(NODE, "2001:db8:0:1::/64", cidr4="198.51.100.0/28"))


def alloc(cid: str, ip6: str, ip4: str | None = None, pod: str = "web-0", netns: str = "/nonexistent") -> Allocation:
    return Allocation(
        cid,
        "default",
        pod,
        "uid-" + cid,
        "eth0",
        netns,
        ipaddress.IPv6Address(ip6),
        ipaddress.IPv4Address(ip4) if ip4 else None,
        state=AllocationState.COMMITTED,
    )


def test_free_ranges_skip_what_the_ipam_never_hands_out():
    four = ipaddress.ip_network("198.51.100.0/28")  # .0 network, .1 gateway side, .15 broadcast
    used = [int(ipaddress.ip_address(a)) for a in ("198.51.100.2", "198.51.100.5", "198.51.100.14")]
    runs = [(str(ipaddress.ip_address(a)), str(ipaddress.ip_address(b))) for a, b in free_ranges(four, used)]
    assert runs == [("198.51.100.3", "198.51.100.4"), ("198.51.100.6", "198.51.100.13")]
    assert free_ranges(four, []) == [(int(four.network_address) + 2, int(four.broadcast_address) - 1)]


def test_pool_report_counts_per_block_and_lists_fixed_addresses_outside():
    rows = [
        alloc("a", "2001:db8:0:1::10", "198.51.100.2"),
        alloc("b", "2001:db8:0:1::11"),
        Allocation("c", "default", "fixed", "", "eth0", "/x", addresses=(ipaddress.ip_address("2001:db8:ffff::5"),)),
    ]
    report = pool_report(CONFIG, rows)
    six, four = report["blocks"]
    assert (six["cidr"], six["used"], six["usable"], six["default"]) == ("2001:db8:0:1::/64", 2, 2**64 - 1, True)
    assert (four["used"], four["free"], four["default"]) == (1, 12, False)
    assert four["largest_free"][0] == {"first": "198.51.100.3", "last": "198.51.100.14", "size": 12}
    assert report["outside"] == [{"address": "2001:db8:ffff::5", "container_id": "c"}]
    assert pool_report(None, rows)["blocks"] == []


BIRDC_PROTOCOLS = """BIRD 2.0.12 ready.
Access restricted
Name       Proto      Table      State  Since         Info
flock_device Device   ---        up     10:01:02.123
bgp_tor1   BGP        ---        up     10:01:05.000  Established
  BGP state:          Established
    Neighbor address: 2001:db8:ffff::1
    Neighbor AS:      64500
  Channel ipv6
    State:          UP
    Routes:         3 imported, 1 exported, 3 preferred
  Channel ipv4
    Routes:         0 imported, 1 exported, 0 preferred
bgp_tor2   BGP        ---        start  10:01:05.000  Active        Socket: Connection refused
  BGP state:          Active
    Neighbor address: 2001:db8:ffff::2
    Neighbor AS:      64501
    Last error:       Socket: Connection refused
"""


def test_birdc_protocols_are_parsed_into_sessions():
    tor1, tor2 = parse_bgp_sessions(BIRDC_PROTOCOLS)
    assert (tor1["name"], tor1["state"], tor1["bgp_state"], tor1["neighbor"], tor1["neighbor_as"]) == (
        "bgp_tor1",
        "up",
        "Established",
        "2001:db8:ffff::1",
        64500,
    )
    assert tor1["channels"] == ["ipv6", "ipv4"] and tor1["exported"] == 2 and tor1["imported"] == 3
    assert (tor2["state"], tor2["last_error"], tor2["info"]) == (
        "start",
        "Socket: Connection refused",
        "Active Socket: Connection refused",
    )
    routes = (
        "BIRD 2.0.12 ready.\nTable master6:\n2001:db8:0:1::/64    unicast [flock_static6 10:01:02] * (200)\n\tdev lo\n"
    )
    assert parse_prefixes(routes) == ["2001:db8:0:1::/64"]


def test_cross_check_finds_gone_pods_foreign_claims_and_overlapping_blocks():
    mine = [
        {"container_id": "a", "namespace": "default", "pod": "web-0", "pod_uid": "u0", "addresses": ["2001:db8:0:1::10"], "netns_alive": True},
        {"container_id": "b", "namespace": "default", "pod": "gone-0", "pod_uid": "u1", "addresses": ["2001:db8:0:1::11"], "netns_alive": False},
        {"container_id": "c", "namespace": "", "pod": "", "pod_uid": "", "addresses": ["2001:db8:0:1::12"], "netns_alive": True},
        {"container_id": "d", "namespace": "", "pod": "podman-web", "pod_uid": "", "addresses": ["2001:db8:0:1::13"], "netns_alive": True},
    ]  # fmt: skip
    web = pod_object("default", "web-0", NODE)
    web["metadata"]["uid"] = "u0"
    web["status"] = {"podIPs": [{"ip": "2001:db8:0:1::10"}, {"ip": "2001:db8:0:1::99"}]}
    twin = pod_object("default", "twin-0", "host002")
    twin["status"] = {"podIP": "2001:db8:0:1::12"}
    host = pod_object("kube-system", "proxy", "host002")
    host["spec"]["hostNetwork"] = True
    host["status"] = {"podIP": "2001:db8:0:1::10"}
    configs = [nodeconfig_object(NODE), nodeconfig_object("host002", "2001:db8:0::/48"), {"metadata": {"name": "bad"}}]
    nodeconfig = {"cidr6": "2001:db8:0:1::/64", "cidr4": None}
    problems, counts = cross_check(NODE, nodeconfig, mine, [web, twin, host], configs)
    found = {(p["kind"], p["subject"]) for p in problems}
    assert found == {
        ("allocation-without-pod", "b"),
        ("pod-ip-not-allocated", "2001:db8:0:1::99"),
        ("address-on-two-nodes", "2001:db8:0:1::12"),
        ("overlapping-block", "2001:db8:0:1::/64"),
    }, problems
    assert counts == {"api_pods": 3, "api_nodeconfigs": 3}


@pytest.fixture
def ops(tmp_path):
    state = NodeState(NODE)
    handler = PodHandler(store=MemoryAllocations(), dataplane=MemoryKernel(), pods=None, state=state)  # type: ignore[arg-type]
    return AdminOps(state=state, handler=handler, netlink=NetlinkWorker(), pending_deletes=tmp_path / "pending")


async def exchange(path, payload: bytes) -> dict:
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        await stream.send_all(payload)
        data = b""
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


async def test_admin_socket_answers_bad_input_with_errors_and_keeps_serving(ops, tmp_path, autojump_clock):
    path = tmp_path / "run" / "admin.sock"
    (tmp_path / "pending").mkdir()
    (tmp_path / "pending" / "c0ffee01.json").write_text("{}")
    async with trio.open_nursery() as nursery:
        await nursery.start(AdminServer(path, ops).run)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        v = ADMIN_PROTOCOL_VERSION
        cases = [
            (b"garbage\n", "bad request"),
            (b"[1, 2]\n", "bad request"),
            (json.dumps({"version": 99, "op": "status"}).encode() + b"\n", "incompatible admin protocol"),
            (json.dumps({"version": v, "op": "reboot"}).encode() + b"\n", "unknown op"),
            (json.dumps({"version": v, "op": "ipam-release", "target": 7}).encode() + b"\n", "invalid target"),
            (json.dumps({"version": v, "op": "ipam-release", "target": "nope"}).encode() + b"\n", "unknown target"),
            (b"x" * (70 << 10) + b"\n", "request too large"),
            (b'{"version": 1, "op": "status"', "bad request"),  # no newline: the read deadline passes
        ]
        for payload, error in cases:
            reply = await exchange(path, payload)
            assert reply["ok"] is False and reply["error"] == error, (payload[:40], reply)
            assert len(reply["details"]) < 600
        reply = await exchange(path, json.dumps({"version": v, "op": "status"}).encode() + b"\n")
        assert reply["ok"] and reply["result"]["queued_deletes"] == ["c0ffee01"] and reply["result"]["bgp"] is None
        assert reply["result"]["agent"]["pid"] == os.getpid()
        nursery.cancel_scope.cancel()
    assert not path.exists()


# -- status: ClusterNetworkPolicies, refused objects, fail-closed rules -----------------------


@attrs.frozen
class Watched:
    """What the policy watchers know (a flock.ctl.PolicyWatch), as values."""

    cluster_policies: dict[str, ClusterNetworkPolicy]
    refused: dict[str, str]


def cnp(name: str, tier: str, *egress: dict[str, Any]) -> ClusterNetworkPolicy:
    spec = {"tier": tier, "priority": 1, "subject": {"namespaces": {}}, "egress": list(egress)}
    return ClusterNetworkPolicy.from_object(cluster_network_policy_object(name, spec))


TO_DOMAIN = {"name": "dns", "action": "Accept", "to": [{"domainNames": ["example.com"]}]}
TO_NET = {"action": "Deny", "to": [{"networks": ["192.0.2.0/24"]}]}


def test_status_counts_cluster_policies_per_tier_and_bounds_what_it_lists():
    policies = {f"p{i:02}": cnp(f"p{i:02}", "Admin", TO_NET, TO_DOMAIN) for i in range(12)}
    policies["base"] = cnp("base", "Baseline", TO_NET)
    refused = {f"NetworkPolicy x/bad{i}": "spec.policyTypes[0]: expected Ingress or Egress" for i in range(3)}
    refused["ClusterNetworkPolicy odd"] = "spec.tier: expected Admin or Baseline"
    view = policy_watch_view(Watched(policies, refused), limit=5)
    assert view["cluster_policies"] == {"Admin": 12, "Baseline": 1}
    assert view["refused_total"] == 4 and len(view["refused"]) == 4
    assert view["refused"][0] == {"object": "ClusterNetworkPolicy odd", "why": "spec.tier: expected Admin or Baseline"}
    assert view["fail_closed_total"] == 12 and len(view["fail_closed"]) == 5
    first = view["fail_closed"][0]
    assert first["policy"] == "p00" and first["rule"].startswith("spec.egress[1] (dns): ")
    assert "domain name" in first["rule"]
    json.dumps(view)  # what the admin socket sends

    pol = {"error": None, "applied": True, "applied_resource_version": 7, "isolated_pods": 2, "chains": 3, "sets": 4}
    lines = policy_lines({**pol, **view})
    assert lines[1] == "cluster     13 ClusterNetworkPolicies (12 Admin, 1 Baseline)"
    assert lines[2] == "refused     ClusterNetworkPolicy odd: spec.tier: expected Admin or Baseline"
    fail_closed = [line for line in lines if line.startswith("fail-closed")]
    assert fail_closed == [f"fail-closed ClusterNetworkPolicy p00 {first['rule']}"]
    assert lines[-1] == "            … and 7 more"
    assert len(lines) == 1 + 1 + 4 + 5 + 1
    # An agent of before (no watcher view in its answer) still renders.
    assert policy_lines(pol) == lines[:1]
    empty = policy_lines({**pol, **policy_watch_view(Watched({}, {}))})
    assert empty[1:] == ["cluster     0 ClusterNetworkPolicies (0 Admin, 0 Baseline)"]


# -- encryption: status lines, rotate refused while off -----------------------------------------


async def test_wireguard_rotate_is_refused_while_encryption_is_off(ops, tmp_path) -> None:
    with pytest.raises(OpRefused, match="encryption is off"):
        await ops.dispatch("wireguard-rotate", {}, None)
    assert (await ops.status())["encryption"] == {"mode": "off"}


def test_encryption_lines_show_the_guard_and_each_peer() -> None:
    enc = {
        "mode": "wireguard",
        "device": "flock-wg",
        "kind": "userspace",
        "mtu": 1420,
        "listen_port": 51820,
        "public_key": "PUB=",
        "rotation_pending": True,
        "peers": [
            {
                "node": "b",
                "public_key": "B=",
                "endpoint": "[2001:db8::2]:51820",
                "allowed_ips": ["10.2.0.0/24", "2001:db8:2::/64"],
                "latest_handshake": 1000,
                "rx_bytes": 5,
                "tx_bytes": 7,
            }
        ],
        "device_error": None,
        "guard": {
            "table": "inet flock-wireguard",
            "counter": "plaintext-dropped",
            "dropped_packets": 12,
            "dropped_bytes": 1000,
            "guarded_blocks": 4,
        },
        "allow_plaintext_to": ["c"],
        "refusals": ["node d: no-key: no public key published yet"],
        "error": None,
        "now": 1065,
    }
    text = "\n".join(encryption_lines(enc))
    assert "encryption  WireGuard  device flock-wg (userspace)  mtu 1420  port 51820  key PUB=" in text
    assert "rotation: waiting for every peer's handshake" in text
    assert "inet flock-wireguard counter plaintext-dropped: 12 packets dropped, 4 remote pod blocks" in text
    assert "in the clear to c" in text and "refused   node d: no-key" in text
    assert "[2001:db8::2]:51820" in text and "65s ago" in text
    assert encryption_lines({"mode": "off"})[-1].startswith("encryption  off")
