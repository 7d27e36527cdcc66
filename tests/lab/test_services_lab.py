"""Services end to end on a lab (issue 33): a three-node dual-stack lab (``flock-lab up --nodes 3
--internet``) whose agents run flock's service proxy, Services made with the machine's kubectl,
EndpointSlices written by the lab's controller, and every path probed with flock-lab's probes,
which name the pod that answered (``served_by``) and the source address it saw.

Issue 34, from outside: what the fabric's BIRD learns (``flock-lab fabric routes``' parser) under every
announcement rule, a readiness flip moving an eTP Local route within a second, rolling restarts and a
drained node under a stream of connections from the internet (none refused, none lost), and the
allow-list refusing a hijack of the internet host's own addresses.

Pods: ``shop/web-{1,2,3}`` on node1..3 (``app=web``, http=8080/TCP, 5353/UDP), ``shop/client`` and
``shop/other`` on node1 (the clients), ``shop/loc`` on node2 (``app=loc``).  Each test makes its own
Service(s) and deletes them; the pods it changes it puts back.

Slow for the main suite (a lab of its own): marked ``services``; .ci/run's services stage runs it
(``pytest -n 0 -m services tests/lab/test_services_lab.py``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from flock.lab import LabPlan, down, fabric_has, load_pods
from flock.lab._fabric import birdc
from flock.lab._nsio import http_in, run_in, socket_in
from flock.lab._plan import INTERNET, INTERNET4, INTERNET6, SERVICE_EXTERNAL_RANGES
from flock.lab._ports import PortSpec
from flock.lab._probe import Endpoint, ProbeResult, endpoint_for, probe_one
from flock.lab._routes import FabricRoute, fabric_routes, parse_routes
from flock.lab._state import require_state
from flock.lab._stream import StreamResult, stream_between
from flock.lab.cli import main

pytestmark = pytest.mark.services

HTTP, DNS = PortSpec(80, "TCP"), PortSpec(53, "UDP")
SERVICE_NAME = "kubernetes.io/service-name"
WEB = ("shop/web-1", "shop/web-2", "shop/web-3")
SETTLE_S = 15.0  # a new Service through the API server, the controller and three agents' tables


@pytest.fixture(scope="module")
def lab(kubectl_path: str) -> Iterator[LabPlan]:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, veths, nftables); CI runs as root")
    for tool in ("bird", "birdc", "nft"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: scripts/bootstrap installs bird2 and nftables")
    directory = Path(tempfile.mkdtemp(prefix="flab-s-", dir="/run"))  # short: unix socket paths
    try:
        assert main(["up", "--nodes", "3", "--internet", "--dir", str(directory)]) == 0
        ports = ["--port", "http=8080/TCP", "--port", "5353/UDP"]
        for i in (1, 2, 3):
            cli(
                directory,
                "pod",
                "add",
                f"node{i}",
                f"shop/web-{i}",
                "--label",
                "app=web",
                "--label",
                f"name=web-{i}",
                *ports,
            )
        cli(directory, "pod", "add", "node1", "shop/client", "--label", "app=client", *ports)
        cli(directory, "pod", "add", "node1", "shop/other", "--label", "app=other", *ports)
        cli(directory, "pod", "add", "node2", "shop/loc", "--label", "app=loc", *ports)
        yield require_state(directory).plan
    finally:
        trio.run(down, directory)
        shutil.rmtree(directory, ignore_errors=True)


def cli(directory: Path, *args: str) -> None:
    assert main([*args, "--dir", str(directory)]) == 0, f"flock-lab {' '.join(args)} failed"


class Kubectl:
    def __init__(self, binary: str, plan: LabPlan) -> None:
        self.base = [binary, f"--kubeconfig={plan.dir / 'kubeconfig'}", "--request-timeout=10s"]

    async def run(self, *args: str, stdin: str | None = None) -> str:
        proc = await trio.run_process(
            [*self.base, *args],
            stdin=None if stdin is None else stdin.encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr.decode()}"
        return proc.stdout.decode()

    async def json(self, *args: str) -> Any:
        return json.loads(await self.run(*args, "-o", "json"))


@pytest.fixture
def kubectl(lab: LabPlan, kubectl_path: str) -> Kubectl:
    return Kubectl(kubectl_path, lab)


def service(name: str, selector: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "ipFamilyPolicy": "RequireDualStack",
        "ports": [
            {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
            {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"},
        ],
        **spec,
    }
    if selector is not None:
        body["selector"] = selector
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop"}, "spec": body}


@asynccontextmanager
async def applied(kubectl: Kubectl, *objects: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
    """Apply *objects* with kubectl, yield them as the API server holds them, delete them afterwards."""
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    await kubectl.run("apply", "-f", "-", stdin=text)
    try:
        yield [await kubectl.json("get", o["kind"].lower(), o["metadata"]["name"], "-n", "shop") for o in objects]
    finally:
        await kubectl.run("delete", "-f", "-", "--wait=false", stdin=text)


def ends(plan: LabPlan, text: str, *, source: bool = False) -> Endpoint:
    return endpoint_for(plan, text, load_pods(plan), source=source)


def at(address: str) -> Endpoint:
    return Endpoint(address, None, (address,))


def cluster_ips(svc: dict[str, Any]) -> dict[int, str]:
    return {ipaddress.ip_address(ip).version: ip for ip in svc["spec"]["clusterIPs"]}


async def probe(plan: LabPlan, source: str, target: Endpoint, port: PortSpec, family: int) -> ProbeResult:
    return await probe_one(ends(plan, source, source=True), target, port, family, peer=True)


async def until(
    plan: LabPlan, source: str, target: Endpoint, port: PortSpec, family: int, ok: Callable[[ProbeResult], bool]
) -> ProbeResult:
    """Probe until *ok* holds (the proxies apply a new Service within a second or two)."""
    with trio.fail_after(SETTLE_S):
        while not ok(r := await probe(plan, source, target, port, family)):
            print(f"{source} → {target.label} {port.label} IPv{family}: {r.reason} by {r.served_by!r}; again")
            await trio.sleep(0.1)
    return r


def connected(r: ProbeResult) -> bool:
    return r.connected


async def served(
    plan: LabPlan, source: str, target: Endpoint, port: PortSpec, family: int, count: int = 24
) -> list[str]:
    """Who served *count* probes (each connected)."""
    out = []
    for _ in range(count):
        r = await probe(plan, source, target, port, family)
        assert r.connected, r
        out.append(r.served_by)
    return out


async def test_cluster_ips_of_each_family_reach_endpoints_on_other_nodes(lab: LabPlan, kubectl: Kubectl) -> None:
    """ClusterIP, IPv6 and IPv4 (single and dual stack), TCP and UDP, from a pod on node1: every
    web pod answers, node2's and node3's among them."""
    with trio.fail_after(120):
        six = service("only6", {"app": "web"}, ipFamilyPolicy="SingleStack")
        four = service("only4", {"app": "web"}, ipFamilyPolicy="SingleStack", ipFamilies=["IPv4"])
        async with applied(kubectl, service("dual", {"app": "web"}), six, four) as (dual, only6, only4):
            assert (
                sorted(cluster_ips(dual)) == [4, 6]
                and list(cluster_ips(only6)) == [6]
                and list(cluster_ips(only4)) == [4]
            )
            for svc, family in ((dual, 6), (dual, 4), (only6, 6), (only4, 4)):
                target = at(cluster_ips(svc)[family])
                for port in (HTTP, DNS):
                    await until(lab, "shop/client", target, port, family, connected)
                    who = set(await served(lab, "shop/client", target, port, family))
                    assert who <= set(WEB) and who & {"shop/web-2", "shop/web-3"}, (svc["metadata"]["name"], port, who)


async def test_node_ports_answer_on_every_nodes_address(lab: LabPlan, kubectl: Kubectl) -> None:
    with trio.fail_after(120):
        async with applied(kubectl, service("np", {"app": "web"}, type="NodePort")) as (svc,):
            ports = {p["name"]: p["nodePort"] for p in svc["spec"]["ports"]}
            for node in lab.nodes:
                for family in (6, 4):
                    for port in (PortSpec(ports["http"], "TCP"), PortSpec(ports["dns"], "UDP")):
                        r = await until(lab, INTERNET, ends(lab, node.name), port, family, connected)
                        assert r.served_by in WEB, r


async def test_external_ips_and_load_balancer_addresses_from_the_internet(lab: LabPlan, kubectl: Kubectl) -> None:
    """externalIPs and status.loadBalancer.ingress (written through the status subresource, as a
    load-balancer controller does) inside the lab's external range, reached from the internet."""
    with trio.fail_after(120):
        external = ["2001:db8:ee::30", "192.0.2.230"]
        lb = service("lb", {"app": "web"}, type="LoadBalancer", externalIPs=external)
        async with applied(kubectl, lb):
            ingress = {"status": {"loadBalancer": {"ingress": [{"ip": "2001:db8:ee::31"}, {"ip": "192.0.2.231"}]}}}
            await kubectl.run(
                "patch", "svc", "lb", "-n", "shop", "--subresource=status", "--type=merge", "-p", json.dumps(ingress)
            )
            got = await kubectl.json("get", "svc", "lb", "-n", "shop")
            assert [i["ip"] for i in got["status"]["loadBalancer"]["ingress"]] == ["2001:db8:ee::31", "192.0.2.231"]
            for address in [*external, "2001:db8:ee::31", "192.0.2.231"]:
                family = ipaddress.ip_address(address).version
                for port in (HTTP, DNS):
                    r = await until(lab, INTERNET, at(address), port, family, connected)
                    assert r.served_by in WEB, r
            # issue 34: every node announces them (eTP Cluster, endpoints ready), as exact routes
            for address in [*external, "2001:db8:ee::31", "192.0.2.231"]:
                ip = ipaddress.ip_address(address)
                await _until_fabric(lab, f"{ip}/{ip.max_prefixlen}", True)
        for address in [*external, "2001:db8:ee::31", "192.0.2.231"]:  # the Service gone: withdrawn
            ip = ipaddress.ip_address(address)
            await _until_fabric(lab, f"{ip}/{ip.max_prefixlen}", False)


async def _until_fabric(lab: LabPlan, net: str, present: bool, within: float = 10.0) -> None:
    with trio.fail_after(within):
        while await fabric_has(lab, net) != present:  # noqa: ASYNC110 (polling BIRD over its socket)
            await trio.sleep(0.1)


async def test_flock_controller_gives_load_balancer_addresses(lab: LabPlan, kubectl: Kubectl) -> None:
    """flock-controller (run by the lab) gives a LoadBalancer Service one address per family from the
    lab's pool, reached from the internet; a Service requesting an address outside every pool gets a
    condition saying so and nothing else."""
    with trio.fail_after(120):
        lb = service("lbauto", {"app": "web"}, type="LoadBalancer")
        outside = service("lbout", {"app": "web"}, type="LoadBalancer")
        outside["metadata"]["annotations"] = {"flock.fritzlab.net/loadBalancerIPs": "198.51.100.7"}
        async with applied(kubectl, lb, outside):
            while True:
                got = await kubectl.json("get", "svc", "lbauto", "-n", "shop")
                given = [i["ip"] for i in ((got.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []]
                if len(given) == 2:
                    break
                await trio.sleep(0.2)
            assert [ipaddress.ip_address(a).version for a in given] == [6, 4]
            assert all(any(ipaddress.ip_address(a) in net for net in SERVICE_EXTERNAL_RANGES) for a in given)
            assert all(i["ipMode"] == "VIP" for i in got["status"]["loadBalancer"]["ingress"])
            row = (await kubectl.run("get", "svc", "lbauto", "-n", "shop", "--no-headers")).split()
            assert sorted(row[3].split(",")) == sorted(given)  # kubectl orders them its own way
            for address in given:
                family = ipaddress.ip_address(address).version
                for port in (HTTP, DNS):
                    r = await until(lab, INTERNET, at(address), port, family, connected)
                    assert r.served_by in WEB, r
            while True:
                refused = await kubectl.json("get", "svc", "lbout", "-n", "shop")
                conditions = [
                    c
                    for c in (refused.get("status") or {}).get("conditions") or []
                    if c["type"] == "flock.fritzlab.net/LoadBalancerAddress"
                ]
                if conditions:
                    break
                await trio.sleep(0.2)
            assert (conditions[0]["status"], conditions[0]["reason"]) == ("False", "NotInPool")
            assert "198.51.100.7" in conditions[0]["message"]
            assert not (refused["status"].get("loadBalancer") or {}).get("ingress")


async def test_a_service_without_endpoints_refuses_at_once(lab: LabPlan, kubectl: Kubectl) -> None:
    with trio.fail_after(120):
        async with applied(kubectl, service("empty", {"app": "nobody"})) as (svc,):
            for family, address in cluster_ips(svc).items():
                for port in (HTTP, DNS):
                    await until(lab, "shop/client", at(address), port, family, lambda r: r.reason == "refused")
                    start = time.monotonic()
                    r = await probe(lab, "shop/client", at(address), port, family)
                    assert (r.connected, r.reason) == (False, "refused") and time.monotonic() - start < 0.5, r


async def _health(lab: LabPlan, node: str, port: int) -> tuple[int, dict[str, Any]]:
    plan_node = lab.node(node)
    assert lab.internet_netns is not None
    status, body = await trio.to_thread.run_sync(
        http_in, lab.internet_netns, str(plan_node.addr4), port, "GET", "/", None, 2.0
    )
    return status, json.loads(body)


async def test_external_traffic_policy_local_keeps_the_client_and_answers_health_checks(
    lab: LabPlan, kubectl: Kubectl
) -> None:
    """eTP Local: a NodePort on the node with the endpoint (node2) reaches it with the internet's own
    address; the other nodes drop; healthCheckNodePort answers 200 there and 503 elsewhere."""
    with trio.fail_after(120):
        svc = service("local", {"app": "loc"}, type="LoadBalancer", externalTrafficPolicy="Local")
        async with applied(kubectl, svc) as (got,):
            node_port = PortSpec(next(p["nodePort"] for p in got["spec"]["ports"] if p["name"] == "http"), "TCP")
            udp_port = PortSpec(next(p["nodePort"] for p in got["spec"]["ports"] if p["name"] == "dns"), "UDP")
            check = got["spec"]["healthCheckNodePort"]
            for family, client in ((6, str(INTERNET6)), (4, str(INTERNET4))):
                for port in (node_port, udp_port):
                    r = await until(lab, INTERNET, ends(lab, "node2"), port, family, connected)
                    assert (r.served_by, r.seen_as) == ("shop/loc", client), r
                for other in ("node1", "node3"):
                    r = await probe(lab, INTERNET, ends(lab, other), node_port, family)
                    assert not r.connected, r
            with trio.fail_after(SETTLE_S):
                while (answer := await _health(lab, "node2", check))[0] != 200:  # noqa: ASYNC110 (polled)
                    await trio.sleep(0.1)
            assert answer[1]["localEndpoints"] >= 1 and answer[1]["service"] == {"namespace": "shop", "name": "local"}
            for other in ("node1", "node3"):
                status, body = await _health(lab, other, check)
                assert (status, body["localEndpoints"]) == (503, 0)


async def test_internal_traffic_policy_local_stays_on_the_node(lab: LabPlan, kubectl: Kubectl) -> None:
    with trio.fail_after(120):
        async with applied(kubectl, service("itp", {"app": "web"}, internalTrafficPolicy="Local")) as (svc,):
            for family, address in cluster_ips(svc).items():
                await until(lab, "shop/client", at(address), HTTP, family, connected)
                assert set(await served(lab, "shop/client", at(address), HTTP, family)) == {"shop/web-1"}
        # Only node2 has a loc pod: from node1, nothing to go to.
        async with applied(kubectl, service("itp-loc", {"app": "loc"}, internalTrafficPolicy="Local")) as (svc,):
            family, address = 6, cluster_ips(svc)[6]
            await until(lab, "node2", at(address), HTTP, family, connected)
            r = await probe(lab, "shop/client", at(address), HTTP, family)
            assert not r.connected, r


async def test_session_affinity_client_ip_sticks(lab: LabPlan, kubectl: Kubectl) -> None:
    with trio.fail_after(120):
        async with applied(kubectl, service("sticky", {"app": "web"}, sessionAffinity="ClientIP")) as (svc,):
            for family, address in cluster_ips(svc).items():
                for port in (HTTP, DNS):
                    await until(lab, "shop/client", at(address), port, family, connected)
                    assert len(set(await served(lab, "shop/client", at(address), port, family))) == 1


async def test_hairpin_and_the_node_itself(lab: LabPlan, kubectl: Kubectl) -> None:
    """A pod reaching itself through its Service (answered by itself, masqueraded to its node's address);
    a node reaching a ClusterIP."""
    with trio.fail_after(120):
        async with applied(kubectl, service("hair", {"name": "web-1"})) as (svc,):
            for family, address in cluster_ips(svc).items():
                r = await until(lab, "shop/web-1", at(address), HTTP, family, connected)
                node1 = lab.node("node1")
                assert (r.served_by, r.seen_as) == ("shop/web-1", str(node1.addr6 if family == 6 else node1.addr4)), r
                for node in ("node1", "node3"):
                    r = await until(lab, node, at(address), DNS, family, connected)
                    assert r.served_by == "shop/web-1", r


async def test_a_readiness_flip_moves_traffic_within_a_second(lab: LabPlan, kubectl: Kubectl) -> None:
    with trio.fail_after(120):
        async with applied(kubectl, service("flip", {"app": "web"})) as (svc,):
            address = cluster_ips(svc)[6]
            await until(lab, "shop/client", at(address), HTTP, 6, connected)
            try:
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "ready", "shop/web-2", "false")
                start = time.monotonic()
                # 30 probes a round: 8 missed web-2 by chance one time in 26 (3 endpoints: (2/3)**8), and the
                # loop then ended before the flip had reached the proxy
                while "shop/web-2" in await served(lab, "shop/client", at(address), HTTP, 6, 30):
                    assert time.monotonic() - start < 1.0, "web-2 still served a second after it went unready"
                took = time.monotonic() - start
                print(f"traffic off web-2 {took * 1000:.0f} ms after `pod ready false` returned")
                assert "shop/web-2" not in await served(lab, "shop/client", at(address), HTTP, 6, 30)
            finally:
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "ready", "shop/web-2", "true")
            await until(lab, "shop/client", at(address), HTTP, 6, lambda r: r.served_by == "shop/web-2")


async def test_a_deleted_pod_drains_without_a_refused_connection(lab: LabPlan, kubectl: Kubectl) -> None:
    """A burst of TCP probes while ``flock-lab pod del`` takes a pod away: each connects (while it is
    terminating the pod is not ready and still serves), and afterwards none reaches it.  (UDP: a new
    flow that reuses a source port of an earlier one to the pod follows its conntrack entry; see
    test_a_udp_flow_to_a_deleted_endpoint_moves_on.)"""
    with trio.fail_after(120):
        ports = ["--port", "http=8080/TCP", "--port", "5353/UDP"]
        for i in (1, 2, 3):
            await trio.to_thread.run_sync(
                cli, lab.dir, "pod", "add", f"node{i}", f"shop/drain-{i}", "--label", "app=drain", *ports
            )
        async with applied(kubectl, service("drain", {"app": "drain"})) as (svc,):
            address = cluster_ips(svc)[6]
            await until(lab, "shop/client", at(address), HTTP, 6, lambda r: r.served_by == "shop/drain-2")
            results: list[ProbeResult] = []
            deleted = trio.Event()

            async def burst() -> None:
                while not deleted.is_set():
                    results.append(await probe(lab, "shop/client", at(address), HTTP, 6))

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(burst)
                await trio.sleep(0.3)
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "del", "shop/drain-2", "--grace", "2")
                await trio.sleep(0.3)
                deleted.set()
            failed = [r for r in results if not r.connected]
            assert not failed and len(results) > 50, (len(results), failed[:5])
            assert "shop/drain-2" not in await served(lab, "shop/client", at(address), HTTP, 6, 30)
            gone = await kubectl.run("get", "pods", "-n", "shop", "-o", "name")
            assert "pod/drain-2" not in gone.split()
        # kubectl's delete: the lab's kubelet stand-in serves it out its grace (2 s), tears it down
        # (CNI DEL) and removes it, and kubectl, which waits for that, returns.
        start = time.monotonic()
        await kubectl.run("delete", "pod", "-n", "shop", "drain-1")
        assert 1.5 < time.monotonic() - start < 10 and "shop/drain-1" not in {p.key for p in load_pods(lab)}
        await trio.to_thread.run_sync(cli, lab.dir, "pod", "del", "shop/drain-3", "--grace", "0")


async def test_network_policy_denies_through_the_cluster_ip(lab: LabPlan, kubectl: Kubectl) -> None:
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "web-from-other", "namespace": "shop"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "other"}}}]}],
        },
    }
    with trio.fail_after(120):
        async with applied(kubectl, service("guarded", {"app": "web"})) as (svc,):
            address = cluster_ips(svc)[6]
            await until(lab, "shop/client", at(address), HTTP, 6, connected)
            async with applied(kubectl, policy):
                await trio.to_thread.run_sync(cli, lab.dir, "policy", "wait")
                for port in (HTTP, DNS):
                    r = await probe(lab, "shop/client", at(address), port, 6)
                    assert not r.connected, r
                    r = await probe(lab, "shop/other", at(address), port, 6)
                    assert r.connected and r.served_by in WEB, r
            await trio.to_thread.run_sync(cli, lab.dir, "policy", "wait")
            await until(lab, "shop/client", at(address), HTTP, 6, connected)


async def _udp_from_port(lab: LabPlan, source: str, address: str, sport: int) -> str:
    """One UDP echo from *source*'s fixed port *sport*: who answered, or why nobody did."""
    raw = await trio.to_thread.run_sync(
        socket_in, ends(lab, source, source=True).netns, socket.AF_INET6, socket.SOCK_DGRAM
    )
    with trio.socket.from_stdlib_socket(raw) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind(("::", sport))
        await sock.connect((address, DNS.port))
        token = secrets.token_bytes(16)
        with trio.move_on_after(1.0):
            try:
                await sock.send(token)
                answer = await sock.recv(4096)
            except ConnectionRefusedError:
                return "refused"
            return answer[len(token) + 1 :].decode().splitlines()[0]
        return "timeout"


async def test_a_udp_flow_to_a_deleted_endpoint_moves_on(lab: LabPlan, kubectl: Kubectl) -> None:
    with trio.fail_after(120):
        ports = ["--port", "http=8080/TCP", "--port", "5353/UDP"]
        for i in (2, 3):
            await trio.to_thread.run_sync(
                cli, lab.dir, "pod", "add", f"node{i}", f"shop/udp-{i}", "--label", "app=udp", *ports
            )
        try:
            async with applied(kubectl, service("udp", {"app": "udp"})) as (svc,):
                address = cluster_ips(svc)[6]
                await until(lab, "shop/client", at(address), DNS, 6, connected)
                sport = 41000  # a source port whose flow goes to udp-2
                while await _udp_from_port(lab, "shop/client", address, sport) != "shop/udp-2":
                    sport += 1
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "del", "shop/udp-2", "--grace", "0")
                await trio.sleep(1.0)  # the slices and every agent's table have it gone by now
                assert await served(lab, "shop/client", at(address), DNS, 6, 10) == ["shop/udp-3"] * 10
                assert await _udp_from_port(lab, "shop/client", address, sport) == "shop/udp-3"
        finally:
            if any(p.key == "shop/udp-2" for p in load_pods(lab)):
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "del", "shop/udp-2", "--grace", "0")
            await trio.to_thread.run_sync(cli, lab.dir, "pod", "del", "shop/udp-3", "--grace", "0")


# --- issue 34: announcements as the fabric sees them, streams from the internet -----------------------------


def lb_service(name: str, selector: dict[str, str], *, etp: str = "Cluster", ips: str | None = None) -> dict[str, Any]:
    """A LoadBalancer Service of http only (the lab's pods answer TCP with their name)."""
    svc = service(name, selector, type="LoadBalancer", externalTrafficPolicy=etp)
    svc["spec"]["ports"] = [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    if ips is not None:
        svc["metadata"]["annotations"] = {"flock.fritzlab.net/loadBalancerIPs": ips}
    return svc


async def routes(lab: LabPlan) -> dict[str, FabricRoute]:
    return {str(r.prefix): r for r in await fabric_routes(lab.fabric_dir / "bird.ctl")}


async def forwarding(lab: LabPlan, address: str) -> set[str]:
    """The nodes the fabric forwards *address* to (empty: no route)."""
    ip = ipaddress.ip_address(address)
    route = (await routes(lab)).get(f"{ip}/{ip.max_prefixlen}")
    return {p.source for p in route.forwarding} if route is not None else set()


async def until_forwarding(lab: LabPlan, address: str, nodes: set[str], within: float = 10.0) -> float:
    """Seconds until the fabric forwards *address* to exactly *nodes*."""
    start = time.monotonic()
    with trio.fail_after(within):
        while (now := await forwarding(lab, address)) != nodes:
            print(f"fabric: {address} via {sorted(now)}, waiting for {sorted(nodes)}")
            await trio.sleep(0.05)
    return time.monotonic() - start


async def addresses_of(kubectl: Kubectl, name: str, count: int = 2) -> list[str]:
    with trio.fail_after(SETTLE_S):
        while True:
            got = await kubectl.json("get", "svc", name, "-n", "shop")
            ingress = ((got.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
            if len(ingress) == count:
                return [i["ip"] for i in ingress]
            await trio.sleep(0.1)


@asynccontextmanager
async def lab_pods(lab: LabPlan, app: str, nodes: list[str]) -> AsyncIterator[list[str]]:
    """Pods ``shop/<app>-<i>`` labelled ``app=<app>``, one per node in *nodes*; deleted afterwards."""
    keys = [f"shop/{app}-{i}" for i in range(1, len(nodes) + 1)]
    for key, node in zip(keys, nodes, strict=True):
        await trio.to_thread.run_sync(
            cli, lab.dir, "pod", "add", node, key, "--label", f"app={app}", "--port", "http=8080/TCP"
        )
    try:
        yield keys
    finally:
        present = {p.key for p in load_pods(lab)}
        for key in keys:
            if key in present:
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "del", key, "--grace", "0")


async def test_the_fabric_learns_what_the_announcement_rules_say(lab: LabPlan, kubectl: Kubectl) -> None:
    """eTP Cluster from every node while an endpoint is ready, withdrawn everywhere without; eTP Local
    only from the nodes with a ready endpoint, a readiness flip moving it within a second; a shared
    address announced while either Service wants it; a pool's communities on its routes, and a
    Service outside the pool's selector given nothing."""
    every = {n.name for n in lab.nodes}
    tagged_pool = {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "LoadBalancerPool",
        "metadata": {"name": "lab-tagged"},
        "spec": {
            "blocks": [{"cidr": "2001:db8:ef::/120"}],
            "serviceSelector": {"matchLabels": {"tier": "public"}},
            "communities": ["64512:34", "64512:3:4"],
            "localPreference": 250,
        },
    }
    tagged = lb_service("tagged", {"app": "ann"}, ips="2001:db8:ef::7")
    tagged["metadata"]["labels"] = {"tier": "public"}
    tagged["spec"].update(ipFamilyPolicy="SingleStack", ipFamilies=["IPv6"])
    untagged = lb_service("untagged", {"app": "ann"}, ips="2001:db8:ef::8")
    untagged["spec"].update(ipFamilyPolicy="SingleStack", ipFamilies=["IPv6"])
    shared_a = lb_service("shared-a", {"app": "ann"}, ips="2001:db8:ee::42,192.0.2.242")
    shared_b = lb_service("shared-b", {"app": "nobody"}, ips="2001:db8:ee::42,192.0.2.242")
    shared_b["spec"]["ports"] = [{"name": "http", "port": 8000, "targetPort": 8080, "protocol": "TCP"}]
    for svc in (shared_a, shared_b):
        svc["metadata"]["annotations"]["flock.fritzlab.net/allow-shared-ip"] = "lab"
    with trio.fail_after(150):
        await kubectl.run("apply", "-f", "-", stdin=json.dumps(tagged_pool))
        try:
            async with (
                lab_pods(lab, "ann", ["node1", "node2"]) as (ann1, ann2),
                applied(
                    kubectl,
                    lb_service("ann-cluster", {"app": "ann"}, ips="2001:db8:ee::40,192.0.2.240"),
                    lb_service("ann-local", {"app": "ann"}, etp="Local", ips="2001:db8:ee::41,192.0.2.241"),
                    tagged,
                    untagged,
                    shared_a,
                    shared_b,
                ),
            ):
                for address in ("2001:db8:ee::40", "192.0.2.240"):
                    await until_forwarding(lab, address, every)
                for address in ("2001:db8:ee::41", "192.0.2.241"):
                    await until_forwarding(lab, address, {"node1", "node2"})
                # a readiness flip of node2's only endpoint moves the Local address off node2
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "ready", ann2, "false")
                took = await until_forwarding(lab, "2001:db8:ee::41", {"node1"}, within=5)
                print(f"eTP Local: node2 out of the fabric's ECMP set {took * 1000:.0f} ms after `pod ready false`")
                assert took < 1.0, f"the fabric still forwarded to node2 {took:.2f} s after its endpoint went unready"
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "ready", ann2, "true")
                await until_forwarding(lab, "2001:db8:ee::41", {"node1", "node2"})
                # no endpoint ready anywhere: eTP Cluster withdrawn from every node, and back
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "ready", ann1, "false")
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "ready", ann2, "false")
                await until_forwarding(lab, "2001:db8:ee::40", set())
                await until_forwarding(lab, "2001:db8:ee::42", set())  # shared-b has no endpoint either
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "ready", ann1, "true")
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "ready", ann2, "true")
                await until_forwarding(lab, "2001:db8:ee::40", every)
                # the shared address: shared-a wants it, shared-b (no endpoint) does not
                assert sorted(await addresses_of(kubectl, "shared-b")) == sorted(["2001:db8:ee::42", "192.0.2.242"])
                await until_forwarding(lab, "2001:db8:ee::42", every)
                # the tagged pool: its communities on the route; the Service outside its selector: nothing
                await until_forwarding(lab, "2001:db8:ef::7", every)
                path = (await routes(lab))["2001:db8:ef::7/128"].paths[0]
                assert (64512, 34) in path.communities and (64512, 3, 4) in path.large_communities, path
                # its localPreference leaves every node's BIRD on the route; the fabric, an eBGP peer,
                # does not get it (LOCAL_PREF stays inside an AS, RFC 4271 5.1.5) and says 100
                for node in lab.nodes:
                    sent = parse_routes(
                        await birdc(node.bird_ctl, "show", "route", "export", "bgp_fabric", "all", "2001:db8:ef::7/128")
                    )
                    assert [p.local_preference for r in sent for p in r.paths] == [250], (node.name, sent)
                assert {p.local_preference for p in (await routes(lab))["2001:db8:ef::7/128"].paths} == {100}
                assert not await fabric_has(lab, "2001:db8:ef::8/128")
                refused = await kubectl.json("get", "svc", "untagged", "-n", "shop")
                assert not ((refused.get("status") or {}).get("loadBalancer") or {}).get("ingress")
        finally:
            await kubectl.run("delete", "loadbalancerpool", "lab-tagged", "--wait=false")


async def endpoint_conditions(kubectl: Kubectl, service_name: str) -> list[dict[str, bool]]:
    slices = await kubectl.json("get", "endpointslices", "-n", "shop")  # (the lab's API server: no label selector)
    mine = [s for s in slices["items"] if s["metadata"].get("labels", {}).get(SERVICE_NAME) == service_name]
    return [e.get("conditions") or {} for s in mine for e in s.get("endpoints") or []]


def _only_terminating(conditions: list[dict[str, bool]]) -> bool:
    """Every endpoint (the pod's, in the IPv6 and the IPv4 slice) serving, terminating, not ready."""
    return bool(conditions) and all(
        (c.get("ready"), c.get("serving"), c.get("terminating")) == (False, True, True) for c in conditions
    )


async def test_etp_local_a_terminating_endpoint_keeps_its_node_while_none_is_ready(
    lab: LabPlan, kubectl: Kubectl
) -> None:
    """eTP Local with one pod, on node3, deleted with a 3 s grace: while it is serving and terminating
    and no endpoint is ready anywhere, node3 still announces the address (and the pod answers the
    internet); once it is gone, nobody does."""
    addresses = ("2001:db8:ee::43", "192.0.2.243")
    with trio.fail_after(60):
        async with (
            lab_pods(lab, "term", ["node3"]) as (pod,),
            applied(kubectl, lb_service("term", {"app": "term"}, etp="Local", ips=",".join(addresses))),
        ):
            for address in addresses:
                await until_forwarding(lab, address, {"node3"})
            await until(lab, INTERNET, at(addresses[0]), HTTP, 6, lambda r: r.served_by == pod)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, cli, lab.dir, "pod", "del", pod, "--grace", "3")
                with trio.fail_after(2):  # the slice says so: serving, terminating, not ready
                    while not _only_terminating(now := await endpoint_conditions(kubectl, "term")):
                        print(f"term's endpoints: {now}")
                        await trio.sleep(0.05)
                for _ in range(10):  # a second and more of it: still node3's, and the pod still answers
                    for address in addresses:
                        assert await forwarding(lab, address) == {"node3"}, address
                    r = await probe(lab, INTERNET, at(addresses[0]), HTTP, 6)
                    assert r.served_by == pod, r
                    await trio.sleep(0.05)
                assert (await endpoint_conditions(kubectl, "term"))[0]["terminating"]
            for address in addresses:  # gone: withdrawn
                await until_forwarding(lab, address, set(), within=5)


async def _roll(lab: LabPlan, app: str, old: list[str], nodes: list[str]) -> list[str]:
    """A rolling update as a Deployment's: for each old pod, a new one on the next node, then the old
    one deleted with a 2 s grace (it keeps serving while terminating)."""
    new = []
    for i, key in enumerate(old):
        fresh = f"shop/{app}-r{i + 1}"
        node = nodes[(i + 1) % len(nodes)]
        await trio.to_thread.run_sync(
            cli, lab.dir, "pod", "add", node, fresh, "--label", f"app={app}", "--port", "http=8080/TCP"
        )
        await trio.to_thread.run_sync(cli, lab.dir, "pod", "del", key, "--grace", "2")
        new.append(fresh)
    return new


@pytest.mark.parametrize("etp", ["Cluster", "Local"])
async def test_a_rolling_restart_under_a_stream_from_the_internet(lab: LabPlan, kubectl: Kubectl, etp: str) -> None:
    """Every pod of a LoadBalancer Service replaced, each new one on another node, while the internet
    opens 50 connections a second to its address: none refused, none lost."""
    app = f"roll-{etp.lower()}"
    nodes = [n.name for n in lab.nodes]
    with trio.fail_after(150):
        async with lab_pods(lab, app, nodes) as old, applied(kubectl, lb_service(app, {"app": app}, etp=etp)):
            v6, _ = await addresses_of(kubectl, app)
            await until_forwarding(lab, v6, set(nodes))
            await until(lab, INTERNET, at(v6), HTTP, 6, lambda r: bool(r.served_by))
            done = trio.Event()
            async with trio.open_nursery() as nursery:
                outcome: list[StreamResult] = []

                async def run_stream() -> None:
                    src, dst = ends(lab, INTERNET, source=True), at(v6)
                    outcome.append(await stream_between(src, dst, HTTP, 6, rate=50, until=done))

                nursery.start_soon(run_stream)
                await trio.sleep(1)
                new = await _roll(lab, app, old, nodes)
                await trio.sleep(3)  # the last old pod's grace, and a little more
                done.set()
            (result,) = outcome
            print(f"rolling restart, eTP {etp}: {result.text()}; first failures: {result.to_json()['first_failures']}")
            assert result.refused == 0 and result.lost == 0, result.to_json()
            assert set(new) <= set(result.served_by) and result.started > 100
            for key in new:
                await trio.to_thread.run_sync(cli, lab.dir, "pod", "del", key, "--grace", "0")


async def test_a_drained_node_under_a_stream_from_the_internet(lab: LabPlan, kubectl: Kubectl) -> None:
    """``kubectl cordon node1``: node1 announces its Service routes with the graceful-shutdown community
    (the fabric stops forwarding to it at once), withdraws them 2 s later, and its pod goes; the
    internet's stream meanwhile: none refused, none lost.  Uncordoned, node1 announces again."""
    every = {n.name for n in lab.nodes}
    with trio.fail_after(150):
        async with (
            lab_pods(lab, "drained", [n.name for n in lab.nodes]) as (pod1, _, _),
            applied(kubectl, lb_service("drained", {"app": "drained"})),
        ):
            v6, _ = await addresses_of(kubectl, "drained")
            await until_forwarding(lab, v6, every)
            done = trio.Event()
            outcome: list[StreamResult] = []
            try:
                async with trio.open_nursery() as nursery:

                    async def run_stream() -> None:
                        src = ends(lab, INTERNET, source=True)
                        outcome.append(await stream_between(src, at(v6), HTTP, 6, rate=50, until=done))

                    nursery.start_soon(run_stream)
                    await trio.sleep(1)
                    await kubectl.run("cordon", "node1")
                    cordoned = time.monotonic()
                    shut: float | None = None  # node1's path seen with the graceful-shutdown community
                    with trio.fail_after(5):  # then withdrawn, after --bgp-leave-seconds=2
                        while node1 := [p for p in (await routes(lab))[f"{v6}/128"].paths if p.source == "node1"]:
                            if node1[0].leaving:
                                assert node1[0].local_preference == 0, node1
                                assert await forwarding(lab, v6) == every - {"node1"}
                                shut = shut if shut is not None else time.monotonic() - cordoned
                            await trio.sleep(0.05)
                    gone = time.monotonic() - cordoned
                    assert shut is not None, "node1's route was withdrawn without the graceful-shutdown community"
                    print(
                        f"cordon node1: 65535:0 at the fabric after {shut * 1000:.0f} ms, withdrawn after {gone:.2f} s"
                    )
                    assert gone - shut > 1.0, (shut, gone)
                    await kubectl.run("delete", "pod", "-n", "shop", pod1.split("/")[1])  # evicted
                    await trio.sleep(1)
                    done.set()
            finally:
                await kubectl.run("uncordon", "node1")
            (result,) = outcome
            print(f"node1 drained: {result.text()}; first failures: {result.to_json()['first_failures']}")
            assert result.refused == 0 and result.lost == 0, result.to_json()
            await until_forwarding(lab, v6, every)  # uncordoned: node1 announces again (eTP Cluster)


async def test_the_allow_list_refuses_a_hijack(lab: LabPlan, kubectl: Kubectl) -> None:
    """CVE-2020-8554: a Service claiming as externalIPs the internet host's own addresses and two outside
    every pool (203.0.113.7, 2001:db8:ffff::7) beside two inside the lab's pool, and one asking for a
    load-balancer address outside every pool: only the pool's addresses are announced and reached from
    the internet; the others the fabric never learns and no node translates (a node still reaches the
    real internet host; the internet reaches no pod at them)."""
    outside = [str(INTERNET6), str(INTERNET4), "2001:db8:ffff::7", "203.0.113.7"]
    inside = ["2001:db8:ee::57", "192.0.2.247"]
    hijack = service("hijack", {"app": "web"}, externalIPs=[*outside, *inside])
    every = {n.name for n in lab.nodes}
    with trio.fail_after(120):
        async with applied(kubectl, hijack, lb_service("grab", {"app": "web"}, ips="2001:db8:bad::7")) as (svc, _):
            for family, address in cluster_ips(svc).items():  # the proxies applied the Service
                await until(lab, "shop/client", at(address), HTTP, family, connected)
            for address in inside:  # the pool's addresses: announced by every node, served
                await until_forwarding(lab, address, every)
                r = await until(lab, INTERNET, at(address), HTTP, ipaddress.ip_address(address).version, connected)
                assert r.served_by in WEB, r
            refused = [*outside, "2001:db8:bad::7"]
            end = trio.current_time() + 2
            while trio.current_time() < end:  # never learned
                learned = await routes(lab)
                for address in refused:
                    ip = ipaddress.ip_address(address)
                    assert f"{ip}/{ip.max_prefixlen}" not in learned, address
                await trio.sleep(0.1)
            for node in lab.nodes:
                table = await trio.run_process(
                    ["ip", "netns", "exec", node.netns, "nft", "list", "table", "inet", "flock-services"],
                    capture_stdout=True,
                )
                text = table.stdout.decode()
                assert all(a in text for a in inside), (node.name, inside)
                assert not [a for a in refused if a in text], (node.name, [a for a in refused if a in text])
                for family, address in ((6, str(INTERNET6)), (4, str(INTERNET4))):
                    r = await probe(lab, node.name, at(address), HTTP, family)
                    assert r.connected and r.served_by == INTERNET, r  # the real host, not a pod
            for address in ("2001:db8:ffff::7", "203.0.113.7", "2001:db8:bad::7"):
                r = await probe(lab, INTERNET, at(address), HTTP, ipaddress.ip_address(address).version)
                assert not r.connected and not r.served_by, r


async def test_a_service_address_off_its_ports_ends_at_the_node(lab: LabPlan, kubectl: Kubectl) -> None:
    """A packet to an announced Service address that no Service port takes (a ping, another port) ends
    at the node the fabric chose.  Otherwise the node, which holds no route to the address, sends it
    back along its default route to the fabric, which sends it to a node again: a loop until the hop
    limit runs out, some 30 crossings of the fabric for each packet from the internet."""
    addresses = ("2001:db8:ee::44", "192.0.2.244")
    with trio.fail_after(60):
        async with applied(kubectl, lb_service("loop", {"app": "web"}, ips=",".join(addresses))):
            assert lab.internet_netns is not None
            for address in addresses:
                await until_forwarding(lab, address, {n.name for n in lab.nodes})
                await until(lab, INTERNET, at(address), HTTP, ipaddress.ip_address(address).version, connected)
                for _ in range(3):  # three flows: the fabric's hash may pick another node for each
                    ping = await run_in(lab.internet_netns, ["ping", "-c", "1", "-W", "1", address])
                    text = ping.stdout.decode() + ping.stderr.decode()
                    assert "exceeded" not in text, f"a ping of {address} from the internet looped:\n{text}"
