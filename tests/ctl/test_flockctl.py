"""flockctl against a real flock-agent (flock.testing.agentlab): the node in
namespaces, bird2, the fake API server over HTTP, the real plugin."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess

import pytest

from flock.apiserver import (
    CLUSTERNETWORKPOLICIES,
    NODECONFIGS,
    PODS,
    cluster_network_policy_object,
    nodeconfig_object,
    pod_object,
)
from flock.testing.agentlab import BIN, CIDR4, CIDR6, NODE, open_lab, wait_for

# The keys of every --json output: scripts rely on them (add keys deliberately, never rename).
STATUS_KEYS = {
    "agent", "allocations", "bgp", "encryption", "exhausted", "gates", "mtu", "node", "nodeconfig", "nodeconfig_deleted",
    "nodeconfig_refused", "not_ready", "notes", "policy", "pools", "queued_deletes", "ready", "service_proxy",
    "veth_removals",
}  # fmt: skip
SERVICE_PROXY_KEYS = {"conflicts", "enabled", "endpoint_slices", "services", "state"}
AGENT_KEYS = {"admin_protocol_version", "cni_wire_versions", "pid", "uptime_s", "version"}
NODECONFIG_KEYS = {"asn", "cidr4", "cidr6", "families", "ip_algo", "name", "peers", "resource_version", "router_id"}
POOL_KEYS = {"anycast", "cidr", "default", "family", "free", "largest_free", "usable", "used"}
POD_KEYS = {
    "addresses", "age_s", "anycast", "container_id", "host_veth", "host_veth_present", "if_name", "namespace",
    "netns", "netns_alive", "network", "pod", "pod_uid", "ports", "state",
}  # fmt: skip
ANNOTATION_CIDR_KEYS = {"cidr", "family", "free", "largest_free", "pods", "usable", "used"}
CHECK_KEYS = {"checked", "node", "problems", "unreached"}
PROBLEM_KEYS = {"detail", "kind", "remedy", "subject"}
RELEASE_KEYS = {"details", "refused", "released", "removed_interfaces", "removed_routes"}
BGP_KEYS = {"error", "exported", "learned", "reachable", "sessions"}
POLICY_KEYS = {
    "applied", "applied_resource_version", "chains", "cluster_policies", "error", "fail_closed", "fail_closed_total",
    "isolated_pods", "refused", "refused_total", "sets",
}  # fmt: skip
SESSION_KEYS = {
    "bgp_state", "exported", "imported", "info", "last_error", "name", "neighbor", "neighbor_as", "since", "state",
}  # fmt: skip


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "ctl") as lab:
        yield lab


def flockctl(lab, *args: str, kubeconfig: bool = True) -> tuple[int, str, dict]:
    """Run the installed flockctl (as an operator would); (exit code, text, JSON of the same command)."""
    common = ["--socket", str(lab.socket.parent / "admin.sock")]
    extra = ["--kubeconfig", str(lab.tmp / "kubeconfig")] if kubeconfig and args[:2] == ("ipam", "check") else []
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    run = [str(BIN / "flockctl"), *args, *common, *extra]
    text = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
    if args[:2] == ("ipam", "release"):  # not twice
        return text.returncode, text.stdout + text.stderr, {}
    as_json = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert as_json.returncode == text.returncode, (text, as_json)
    return text.returncode, text.stdout + text.stderr, json.loads(as_json.stdout) if as_json.stdout else {}


def release(lab, *args: str) -> tuple[int, dict]:
    run = [str(BIN / "flockctl"), "ipam", "release", *args, "--json", "--socket", str(lab.socket.parent / "admin.sock")]
    out = subprocess.run(run, capture_output=True, text=True, timeout=60)
    return out.returncode, json.loads(out.stdout)


def add(lab, cid: str, pod: str, **annotations: str):
    """ADD *pod* (created on the API server) as *cid*; (its IPv6 address, its netns)."""
    lab.api.create(PODS, pod_object("default", pod, NODE, annotations=annotations))
    netns = lab.pool.create(pod)
    out = lab.cni("ADD", cid, netns, pod)
    assert out.status == 0, out
    return ipaddress.ip_interface(out.json["ips"][0]["address"]).ip, netns


def kinds(report: dict) -> set[tuple[str, str]]:
    return {(p["kind"], p["subject"]) for p in report["problems"]}


def test_status_pods_show_and_bgp_json_keys_are_pinned(lab):
    agent = lab.agent()
    agent.wait_ready()
    web, _ = add(lab, "c7100001", "web-0")
    narrow, _ = add(lab, "c7100002", "db-0", **{"flock.fritzlab.net/cidr6": "2001:db8:0:1:ab::/120"})
    wait_for("the BGP session in BIRD", lambda: "tor1" in lab.birdc("show", "protocols"))

    code, text, st = flockctl(lab, "status")
    assert code == 0, text
    assert st["veth_removals"] == {"pending": 0, "failures": 0}
    assert set(st) == STATUS_KEYS and set(st["agent"]) == AGENT_KEYS and set(st["nodeconfig"]) == NODECONFIG_KEYS
    assert set(st["policy"]) == POLICY_KEYS and st["policy"]["error"] is None, st["policy"]
    assert set(st["service_proxy"]) == SERVICE_PROXY_KEYS and not st["service_proxy"]["enabled"]
    assert "services    off (flock-agent --service-proxy turns it on)" in text
    assert st["encryption"] == {"mode": "off"} and "encryption  off" in text
    assert all(set(p) == POOL_KEYS for p in st["pools"]) and len(st["pools"]) == 2
    assert st["ready"] and st["node"] == NODE and st["allocations"] == {"pending": 0, "committed": 2}
    assert st["agent"]["cni_wire_versions"] and st["agent"]["admin_protocol_version"] == 1
    six = next(p for p in st["pools"] if p["family"] == "ipv6")
    assert (six["cidr"], six["used"]) == (CIDR6, 2)
    assert "READY" in text and CIDR6 in text and "tor1" in text
    assert st["mtu"]["value"] >= 1280 and st["mtu"]["source"] and f"mtu         {st['mtu']['value']}  (" in text
    assert st["policy"]["cluster_policies"] == {"Admin": 0, "Baseline": 0} and st["policy"]["refused"] == []

    # A ClusterNetworkPolicy with a rule flock cannot read (domain names): counted, and the rule named.
    lab.api.create(
        CLUSTERNETWORKPOLICIES,
        cluster_network_policy_object(
            "dns",
            {
                "tier": "Admin",
                "priority": 3,
                "subject": {"namespaces": {"matchLabels": {"selects": "nothing"}}},
                "egress": [{"name": "to-dns", "action": "Accept", "to": [{"domainNames": ["example.com"]}]}],
            },
        ),
    )
    wait_for(
        "the ClusterNetworkPolicy in flockctl status",
        lambda: flockctl(lab, "status")[2]["policy"]["cluster_policies"]["Admin"] == 1,
    )
    code, text, st = flockctl(lab, "status")
    assert st["policy"]["fail_closed_total"] == 1
    (rule,) = st["policy"]["fail_closed"]
    assert rule["policy"] == "dns" and rule["rule"].startswith("spec.egress[0] (to-dns): ")
    assert "cluster     1 ClusterNetworkPolicies (1 Admin, 0 Baseline)" in text
    assert "fail-closed ClusterNetworkPolicy dns spec.egress[0] (to-dns): " in text

    code, text, pods = flockctl(lab, "pods")
    assert code == 0 and set(pods) == {"pods", "kernel_read"}
    pod, _db = sorted(pods["pods"], key=lambda p: p["pod"], reverse=True)
    assert set(pod) == POD_KEYS and pod["pod"] == "web-0" and str(web) in pod["addresses"]
    assert pod["host_veth_present"] and pod["netns_alive"] and pod["state"] == "committed"
    assert "default/web-0" in text
    assert [p["container_id"] for p in flockctl(lab, "pods", "--address", str(web))[2]["pods"]] == ["c7100001"]
    assert flockctl(lab, "pods", "--namespace", "kube-system")[0] == 1  # nothing matched
    assert pod["network"] == "flock-net" and pod["ports"] == [] and "HOST PORTS" not in text
    assert flockctl(lab, "pods", "--network", "podman")[0] == 1
    # A pod with hostPorts: the column appears, with what each maps.
    lab.api.create(PODS, pod_object("default", "ingress-0", NODE))
    ports = {"portMappings": [{"hostPort": 8443, "containerPort": 443, "protocol": "tcp", "hostIP": "2001:db8::1"}]}
    assert lab.cni("ADD", "c7100003", lab.pool.create("ingress"), "ingress-0", runtimeConfig=ports).status == 0
    code, text, pods = flockctl(lab, "pods", "--pod", "ingress-0", "--network", "flock-net")
    assert code == 0 and pods["pods"][0]["ports"] == ["[2001:db8::1]:8443/tcp → 443"]
    assert "HOST PORTS" in text and "[2001:db8::1]:8443/tcp → 443" in text

    code, text, show = flockctl(lab, "ipam", "show")
    assert code == 0 and set(show) == {"node", "blocks", "outside", "annotation_cidrs"}
    [sub] = show["annotation_cidrs"]
    assert set(sub) == ANNOTATION_CIDR_KEYS and (sub["cidr"], sub["pods"], sub["used"], sub["usable"]) == (
        "2001:db8:0:1:ab::/120",
        1,
        1,
        255,
    )
    assert narrow in ipaddress.ip_network(sub["cidr"]) and "annotation CIDRs" in text
    four = next(b for b in show["blocks"] if b["cidr"] == CIDR4)
    # 198.51.100.0/29: .0, .1 and .7 are never handed out → .2-.6 usable, all free (web-0 asked for IPv6 only).
    assert (four["usable"], four["used"], four["largest_free"][0]["first"]) == (5, 0, "198.51.100.2")
    assert "largest free ranges" in text

    code, text, bgp = flockctl(lab, "bgp")
    assert set(bgp) == BGP_KEYS and bgp["reachable"], bgp
    [tor] = bgp["sessions"]
    assert set(tor) == SESSION_KEYS and tor["name"] == "bgp_tor1" and tor["neighbor"] == "2001:db8:ffff::1"
    assert code == 1  # the ToR is not there: the session is not established
    assert bgp["exported"] == [] and bgp["learned"] == [], bgp  # nothing is announced over a session that is down


def test_ipam_check_finds_leaks_and_release_repairs_them(lab):
    agent = lab.agent()
    agent.wait_ready()
    gone, gone_ns = add(lab, "c7200001", "gone-0")
    live, _ = add(lab, "c7200002", "live-0")
    code, text, report = flockctl(lab, "ipam", "check")
    assert code == 0 and report["problems"] == [] and report["unreached"] == [], text
    assert set(report) == CHECK_KEYS and report["checked"]["api_pods"] == 2

    # 1. a row without a pod: the runtime lost the DEL (netns and pod gone, allocation kept)
    lab.api.delete(PODS, "gone-0", "default")
    lab.pool.delete(gone_ns)
    # 2. a flock veth without a row
    lab.node.ip("link", "add", "flock0badf00d", "type", "veth", "peer", "name", "ctl-peer")
    # 3. live-0's address also claimed by a pod on another node, whose NodeConfig overlaps ours
    other = pod_object("default", "twin-0", "host002")
    other["status"] = {"phase": "Running", "podIP": str(live), "podIPs": [{"ip": str(live)}]}
    lab.api.create(PODS, other)
    lab.api.create(NODECONFIGS, nodeconfig_object("host002", "2001:db8:0:1:8000::/80"))

    code, text, report = flockctl(lab, "ipam", "check")
    assert code == 1, text
    assert all(set(p) == PROBLEM_KEYS for p in report["problems"])
    assert {
        ("leaked-allocation", "c7200001"),
        ("allocation-without-pod", "c7200001"),
        ("orphan-interface", "flock0badf00d"),
        ("address-on-two-nodes", str(live)),
        ("overlapping-block", CIDR6),
    } <= kinds(report), report
    assert "flockctl ipam release c7200001" in text and "flockctl ipam release flock0badf00d" in text

    # Refused: live-0 still has its network namespace.
    code, out = release(lab, str(live))
    assert code == 1 and set(out) == RELEASE_KEYS and out["refused"] == "the attachment is live", out
    assert "c7200002" in lab.rows()

    code, out = release(lab, "c7200001")
    assert code == 0 and [r["container_id"] for r in out["released"]] == ["c7200001"], out
    assert str(gone) in out["released"][0]["addresses"]
    code, out = release(lab, "flock0badf00d")
    assert code == 0 and out["removed_interfaces"] == ["flock0badf00d"], out
    assert "flock0badf00d" not in lab.flock_links()
    code, out = release(lab, str(live), "--force")
    assert code == 0 and out["released"][0]["container_id"] == "c7200002", out
    assert set(lab.rows()) == set() and lab.flock_links() == set() and lab.flock_routes() == []
    assert release(lab, "c7200001")[0] == 1  # already gone: nothing holds it

    # Who released what is in the agent's log, with the peer's credentials.
    released = [r for r in agent.records() if r.get("msg") == "allocation released through the admin socket"]
    assert {r["container_id"] for r in released} == {"c7200001", "c7200002"}
    assert all(r["peer_uid"] == os.getuid() and r["peer_pid"] > 0 for r in released)
    assert any(r["force"] for r in released if r["container_id"] == "c7200002")

    lab.api.delete(PODS, "twin-0", "default")
    lab.api.delete(NODECONFIGS, "host002")
    code, text, report = flockctl(lab, "ipam", "check")
    assert code == 0 and report["problems"] == [], text
    # The addresses are free again: a new pod gets the lowest IPv4 and the block usage is back to 0.
    assert flockctl(lab, "ipam", "show")[2]["blocks"][0]["used"] == 0


def test_local_parts_work_with_the_api_server_down_and_exit_codes(lab):
    agent = lab.agent()
    agent.wait_ready()
    add(lab, "c7300001", "web-0")
    lab.api.stop()
    code, text, report = flockctl(lab, "ipam", "check")
    assert code == 0, text
    assert [u["part"] for u in report["unreached"]] == ["api"] and report["checked"]["store_rows"] == 1
    assert "NOT CHECKED api:" in text and "no problems found in the parts checked" in text
    lab.node.ip("link", "add", "flock0badf00e", "type", "veth", "peer", "name", "ctl-peer")
    code, text, report = flockctl(lab, "ipam", "check")
    assert code == 1 and kinds(report) == {("orphan-interface", "flock0badf00e")}, text
    assert flockctl(lab, "status")[0] == 0
    assert flockctl(lab, "pods", "--pod", "web-0")[2]["pods"][0]["container_id"] == "c7300001"

    # Usage errors and an unreachable agent: 2.
    assert subprocess.run([str(BIN / "flockctl"), "frobnicate"], capture_output=True).returncode == 2
    agent.stop()
    gone = subprocess.run(
        [str(BIN / "flockctl"), "status", "--socket", str(lab.socket.parent / "admin.sock")],
        capture_output=True,
        text=True,
    )
    assert gone.returncode == 2 and "cannot reach flock-agent" in gone.stderr


def test_release_takes_the_container_id_prefix_that_pods_shows(lab):
    # Issue 25: `flockctl pods` prints 16 characters of a 64-character ID; release takes them.
    agent = lab.agent()
    agent.wait_ready()
    first, second = "c74" + "0" * 60 + "1", "c74" + "0" * 60 + "2"
    add(lab, first, "web-0")
    _, netns = add(lab, second, "web-1")
    code, text, _ = flockctl(lab, "pods")
    shown = [line.split()[0] for line in text.splitlines()[1:] if line.strip()]
    assert code == 0 and shown == [first[:16], second[:16]], text

    code, out = release(lab, shown[0])
    assert code == 1 and out["refused"] == "ambiguous container ID prefix", out
    assert first in out["details"] and second in out["details"] and "default/web-1" in out["details"]
    code, out = release(lab, "c74")
    assert code == 1 and out["refused"] == "container ID prefix too short", out

    lab.pool.delete(netns)
    code, out = release(lab, second[:-1] + "2")  # the full ID, as before
    assert code == 0 and [r["container_id"] for r in out["released"]] == [second], out
    code, out = release(lab, shown[0], "--force")  # unique now
    assert code == 0 and [r["container_id"] for r in out["released"]] == [first], out
    assert lab.rows() == {} and lab.flock_links() == set()
