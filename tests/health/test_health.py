"""/healthz, /readyz and /metrics over real TCP; the metrics text format."""

from __future__ import annotations

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from flock.agent import DEFAULT_HEALTH_ADDRESS, parse_args
from flock.health import HealthServer, Metrics
from flock.state import Gate, NodeState


async def http(port: int, raw: bytes) -> tuple[int, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exposition parsed by prometheus-client's own parser: (name, sorted labels) → value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_probes_and_metrics_over_http():
    state = NodeState("host001", [Gate("nodeconfig", "NodeConfig host001 not loaded")])
    metrics = Metrics()
    metrics.observe("ADD", 0, 0.003)
    metrics.observe("ADD", 0, 0.2)
    metrics.observe("ADD", 11, 25.0)
    metrics.stage("ADD", "netlink", 0.002)
    metrics.stage("ADD", "netlink", 0.003)
    metrics.stage("DEL", "netlink", 0.04)
    metrics.labelled_gauge("flock_allocations", "Pod allocations.", "state", ["committed"], lambda: {"committed": 2})
    server = HealthServer("127.0.0.1", 0, readiness=state, metrics=metrics)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            port = server.bound_port
            get = lambda path: http(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())  # noqa: E731
            assert await get("/healthz") == (200, "ok\n")
            assert await get("/readyz") == (503, "not ready:\n- NodeConfig host001 not loaded\n")
            state.set_note("bird", "BIRD not configured yet (retrying): no socket")
            state.open_gate("nodeconfig")
            assert await get("/readyz?verbose=1") == (
                200,
                "ready\nnotes:\n- BIRD not configured yet (retrying): no socket\n",
            )
            status, text = await get("/metrics")
            assert status == 200
            got = samples(text)
            assert got[("flock_cni_requests_total", (("code", "0"), ("op", "ADD")))] == 2
            assert got[("flock_cni_requests_total", (("code", "11"), ("op", "ADD")))] == 1
            assert got[("flock_cni_request_duration_seconds_bucket", (("le", "0.005"), ("op", "ADD")))] == 1
            assert got[("flock_cni_request_duration_seconds_bucket", (("le", "0.25"), ("op", "ADD")))] == 2
            assert got[("flock_cni_request_duration_seconds_bucket", (("le", "+Inf"), ("op", "ADD")))] == 3
            assert got[("flock_cni_request_duration_seconds_count", (("op", "ADD"),))] == 3
            netlink = (("op", "ADD"), ("stage", "netlink"))
            assert got[("flock_cni_stage_duration_seconds_count", netlink)] == 2
            assert got[("flock_cni_stage_duration_seconds_sum", netlink)] == pytest.approx(0.005)
            assert got[("flock_cni_stage_duration_seconds_count", (("op", "DEL"), ("stage", "netlink")))] == 1
            assert (
                got[("flock_allocations", (("state", "committed"),))] == 2 and "# TYPE flock_allocations gauge" in text
            )
            # The library's process and platform collectors, in the agent's own registry.
            assert got[("process_open_fds", ())] > 0 and any(name == "python_info" for name, _ in got)
            assert metrics.requests("ADD") == 2 and metrics.requests("ADD", 11) == 1
            assert (await get("/nope"))[0] == 404
            assert (await http(port, b"POST /readyz HTTP/1.0\r\n\r\n"))[0] == 405
            assert (await http(port, b"garbage\r\n\r\n"))[0] == 400
            assert await http(port, b"HEAD /healthz HTTP/1.0\r\n\r\n") == (200, "")
            # A client that says nothing is dropped without stopping the server.
            silent = await trio.open_tcp_stream("127.0.0.1", port)
            assert await get("/healthz") == (200, "ok\n")
            await silent.aclose()
            nursery.cancel_scope.cancel()


def test_agent_cli_flags(tmp_path):
    s, _ = parse_args(["--node", "n1"], {})
    assert (s.health_address, s.bird, s.host_netns, s.bgp_lab_timers) == (DEFAULT_HEALTH_ADDRESS, True, None, False)
    assert str(s.bird_config) == "/etc/flock/bird/bird.conf" and str(s.bird_socket) == "/run/flock/bird.ctl"
    s, _ = parse_args(
        [
            "--node",
            "n1",
            "--health-address",
            "[::1]:0",
            "--no-bird",
            "--bgp-lab-timers",
            "--host-netns",
            str(tmp_path),
            "--uplink",
            "eth9",
        ],
        {},
    )
    assert (s.health_address, s.bird, s.bgp_lab_timers, s.host_netns, s.uplink) == (
        ("::1", 0),
        False,
        True,
        str(tmp_path),
        "eth9",
    )
    for bad in (
        ["--health-address", "9464"],
        ["--health-address", "h:99999"],
        ["--host-netns", str(tmp_path / "none")],
        ["--bird-config", "rel/bird.conf"],
    ):
        with pytest.raises(SystemExit) as info:
            parse_args(["--node", "n1", *bad], {})
        assert info.value.code == 2


def test_two_agents_in_one_process_have_registries_of_their_own():
    first, second = Metrics(), Metrics()
    first.observe("DEL", 0, 0.001)
    assert (first.requests("DEL"), second.requests("DEL")) == (1, 0)
