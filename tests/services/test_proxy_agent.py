"""The real flock-agent and its service proxy on a node namespace: refused beside kube-proxy (named in
flockctl status, nothing of flock's added) and on by itself once kube-proxy is gone; off, a table an
earlier run left is removed; the agent is ready either way (nothing of the pods waits for Services)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flock.testing.agentlab import Lab, open_lab, wait_for

pytestmark = pytest.mark.usefixtures("require_root")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with open_lab(tmp_path, "fl-spa-", bird=False) as lab:
        yield lab


def tables(lab: Lab) -> set[str]:
    return {line.strip() for line in lab.node.run("nft", "list", "tables").stdout.splitlines() if line.strip()}


def test_beside_kube_proxy_the_proxy_stays_off_and_says_why(lab: Lab):
    lab.node.run("nft", "add table ip kube-proxy")
    agent = lab.agent(FLOCK_SERVICE_PROXY="true")
    agent.wait_ready()  # nothing of the pods waits for the service proxy
    code, text, st = lab.flockctl("status")
    assert code == 0, text
    proxy = st["service_proxy"]
    assert proxy["enabled"] and "kube-proxy is on this node" in proxy["state"], proxy
    assert "nftables table ip kube-proxy" in proxy["state"]
    assert any("kube-proxy is on this node" in note for note in st["notes"])
    assert "services    service proxy off: kube-proxy is on this node" in text
    assert "table inet flock-services" not in tables(lab)
    status, body = agent.get("/readyz")
    assert status == 200 and "kube-proxy is on this node" in body
    code, text, out = lab.flockctl("services")
    assert code == 1 and out.get("services") == [] and "kube-proxy" in text, (code, text, out)


def test_off_removes_a_table_an_earlier_run_left(lab: Lab):
    lab.node.run("nft", "add table inet flock-services; add chain inet flock-services services")
    agent = lab.agent()
    agent.wait_ready()
    wait_for("the services table to go", lambda: "table inet flock-services" not in tables(lab))
    _, _, st = lab.flockctl("status")
    assert not st["service_proxy"]["enabled"] and st["service_proxy"]["state"].startswith("off")


def test_a_service_applied_to_the_api_server_is_in_the_nodes_table(lab: Lab):
    from flock.apiserver import ENDPOINTSLICES, SERVICES
    from flock.testing.services import endpoint, endpoint_slice, port, slice_port

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "default", "name": "web"}}
    svc["spec"] = {"selector": {"app": "web"}, "ports": [port("http", 80, target=8080)]}
    created = lab.api.create(SERVICES, svc)
    cluster_ip = created["spec"]["clusterIP"]  # allocated by the API server, from its service range
    lab.api.create(
        ENDPOINTSLICES, endpoint_slice("web", [endpoint("2001:db8:0:1::7", "node-x")], [slice_port("http", 8080)])
    )
    agent = lab.agent(FLOCK_SERVICE_PROXY="true")
    agent.wait_ready()
    wait_for(
        "the Service in the node's table",
        lambda: cluster_ip in lab.node.run("nft", "list", "table", "inet", "flock-services", check=False).stdout,
    )
    code, text, out = lab.flockctl("services", "default/web")
    assert code == 0, text
    assert out["proxy"]["state"] == "in sync" and out["services"][0]["cluster_ips"] == [cluster_ip]
    [family] = out["services"][0]["ports"][0]["families"].values()
    assert [(e["address"], e["chosen"], e["why"]) for e in family["endpoints"]] == [("2001:db8:0:1::7", True, "ready")]
