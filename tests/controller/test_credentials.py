"""flock-controller as a process, with a kubeconfig's bearer token against the API server fake
checking it (401 otherwise): it authenticates and does its work, its logs are JSON lines carrying
the Service's key, and the token appears in none of them — neither when it works nor when the
server refuses it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flock.apiserver import LOADBALANCERPOOLS, NAMESPACES, SERVICES, ApiServer, namespace_object

from .test_race import ingress, lb_service, pool

TOKEN = "flock-s3cret-7f9d2a41c0b84e6e"
CONTROLLER = (sys.executable, "-m", "flock.controller")


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(service_cluster_ip_range="fd00:10:96::/112,192.0.2.192/27", tokens=frozenset({TOKEN})) as server:
        server.store.create(NAMESPACES, namespace_object("default"))
        yield server


def run_until(kubeconfig: Path, log: Path, done: Callable[[], bool], within: float) -> str:
    """flock-controller until *done* (polled) or *within* seconds; its stdout and stderr."""
    with (
        log.open("w") as out,
        subprocess.Popen(
            [*CONTROLLER, "--kubeconfig", str(kubeconfig), "--identity", "c0", "--lease-namespace", "default"],
            stdout=out,
            stderr=subprocess.STDOUT,
        ) as proc,
    ):
        try:
            deadline = time.monotonic() + within
            while not done() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert done(), log.read_text()[-3000:]
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return log.read_text()


def records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_the_token_authenticates_and_reaches_no_log(api: ApiServer, tmp_path: Path) -> None:
    api.store.create(LOADBALANCERPOOLS, pool("lab", "2001:db8:ee::/120", "192.0.2.224/27"))
    api.store.create(SERVICES, lb_service("web"))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token=TOKEN)
    text = run_until(
        kubeconfig, tmp_path / "good.log", lambda: len(ingress(api.store.get(SERVICES, "web", "default"))) == 2, 30
    )
    assert TOKEN not in text
    written = [r for r in records(text) if r.get("msg") == "service status written"]
    assert written and written[0]["service"] == "default/web", text


def test_a_refused_token_is_logged_without_it(api: ApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token=TOKEN + "-revoked")
    log = tmp_path / "refused.log"
    text = run_until(kubeconfig, log, lambda: log.exists() and "401" in log.read_text(), 30)
    assert TOKEN not in text
    refused = [r for r in records(text) if "401" in str(r.get("error"))]
    assert refused and refused[0]["msg"] == "lease write failed", text
