"""``flock-lab kubeconfig``: kubectl on the host reaches the lab's API server, which serves the
fabric namespace (what the nodes use) and the host's loopback at once.

Only the lab's network and its API server process are made (no agents, no BIRD): what the
command depends on.  Needs root (namespaces) and kubectl (skipped without it; CI has it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import trio

from flock.apiserver import node_object
from flock.lab import LabPlan
from flock.lab._lifecycle import api_client, build_network, down, process_specs
from flock.lab._nsio import http_in
from flock.lab._state import LabState


def test_kubeconfig_reaches_the_lab_apiserver_from_the_host(
    require_root: None, kubectl_path: str, tmp_path: Path
) -> None:
    plan = LabPlan.make(tmp_path / "lab", 1)
    plan.dir.mkdir()
    LabState(plan, False).save()
    spec = next(s for s in process_specs(plan, nodes=False) if s.name == "apiserver")
    server: subprocess.Popen[bytes] | None = None
    try:
        build_network(plan)
        with spec.log.open("wb") as log:
            server = subprocess.Popen(spec.argv, stdout=log, stderr=subprocess.STDOUT, env=spec.env)
        deadline = time.monotonic() + 15
        while not (plan.dir / "kubeconfig").exists():
            assert server.poll() is None and time.monotonic() < deadline, spec.log.read_text()
            time.sleep(0.05)
        command = [sys.executable, "-m", "flock.lab.cli", "kubeconfig", "--dir", str(plan.dir)]
        printed = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
        assert printed.stdout == f"{plan.dir / 'kubeconfig'}\n"
        doc = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True, check=True).stdout)
        assert doc["kubeconfig"] == str(plan.dir / "kubeconfig") and doc["server"].startswith("http://127.0.0.1:")
        # What the nodes reach (the fabric address, in the fabric namespace) is the same server.
        api = api_client(plan)
        status, body = http_in(api.netns, api.host, api.port, "POST", "/api/v1/nodes", node_object("node1"))
        assert status == 201, body
        base = [kubectl_path, f"--kubeconfig={doc['kubeconfig']}", f"--cache-dir={tmp_path / 'cache'}"]
        out = subprocess.run([*base, "get", "nodes"], capture_output=True, text=True, timeout=30, check=True)
        assert out.stdout.splitlines()[1].split()[0] == "node1"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "app:1"}]},
        }
        subprocess.run([*base, "apply", "-f", "-"], input=json.dumps(pod), text=True, check=True, capture_output=True)
        status, body = http_in(api.netns, api.host, api.port, "GET", "/api/v1/namespaces/default/pods/web")
        assert status == 200 and json.loads(body)["spec"]["containers"][0]["image"] == "app:1"
        got = subprocess.run([*base, "get", "po", "web", "-o", "name"], capture_output=True, text=True, check=True)
        assert got.stdout.strip() == "pod/web"
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        trio.run(down, plan.dir)
    assert not (plan.dir / "kubeconfig").exists()
