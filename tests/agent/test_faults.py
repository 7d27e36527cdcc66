"""Operational failures on one node, against a real flock-agent process: what an
operator hits (broken state directory, two agents, API server trouble, BIRD
missing, signals) and what the agent must do about it."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import signal
import time

import pytest

from flock.apiserver import NODECONFIGS, PODS, nodeconfig_object, pod_object
from flock.model import AllocationState
from flock.testing.agentlab import CIDR4, CIDR6, NODE, open_lab, wait_for

pytestmark = pytest.mark.usefixtures("require_root")
# Fatal start-up problems must end the process well before restart intensity
# would (5 restarts with backoff ≈ 15 s): a generous bound, not a timing figure.
FAST_EXIT_S = 10


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "fl-fault-", bird=False) as lab:
        yield lab


def _fatal_exit(agent) -> str:
    began = time.monotonic()
    rc = agent.proc.wait(timeout=30)
    took = time.monotonic() - began
    text = agent.log.read_text()
    assert rc == 1, text[-2000:]
    assert took < FAST_EXIT_S, f"exit took {took:.1f} s: hidden behind restarts"
    fatal = [line for line in text.splitlines() if line.startswith("flock-agent: fatal: ")]
    assert len(fatal) == 1, text[-2000:]
    return fatal[0]


def test_corrupt_database_exits_at_once_naming_the_file_and_the_remedy(lab):
    lab.state_dir.mkdir(mode=0o700)
    (lab.state_dir / "flock.db").write_bytes(b"not sqlite " * 500)
    line = _fatal_exit(lab.agent())
    assert f"{lab.state_dir / 'flock.db'}: file is not a database" in line
    assert "Restore the file from a backup, or move it" in line
    assert (
        lab.state_dir / "flock.db"
    ).read_bytes() == b"not sqlite " * 500  # never "repaired" behind the operator's back


def test_state_dir_that_is_not_a_directory_exits_at_once(lab):
    lab.state_dir.write_text("oops")
    line = _fatal_exit(lab.agent())
    assert (
        line == f"flock-agent: fatal: state directory {lab.state_dir}: exists and is not a directory; "
        "mount a writable directory there or pass --state-dir"
    )


def test_second_agent_on_the_socket_exits_at_once_and_the_first_keeps_serving(lab):
    first = lab.agent()
    first.wait_ready()
    line = _fatal_exit(lab.agent())
    assert line == f"flock-agent: fatal: another flock-agent answers on {lab.socket}"
    assert first.proc.poll() is None and lab.socket.exists()
    assert lab.cni("STATUS").status == 0


def _metric(agent, name: str) -> float:
    lines = [line for line in agent.get("/metrics")[1].splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, name
    return float(lines[0].split()[1])


def _add(lab, cid: str, pod: str):
    lab.api.create(PODS, pod_object("default", pod, NODE))
    out = lab.cni("ADD", cid, lab.pool.create(pod), pod)
    assert out.status == 0, out
    return ipaddress.ip_interface(out.json["ips"][0]["address"]).ip


def test_nodeconfig_refused_keeps_the_last_good_one_and_deleted_stops_add_until_recreated(lab):
    agent = lab.agent()
    agent.wait_ready()
    first = _add(lab, "c0ffee01", "web-0")
    routes = lab.flock_routes()

    lab.api.patch(NODECONFIGS, NODE, {"spec": {"cidr6": "2001:db8:0:1::/200"}})
    wait_for(
        "the refusal", lambda: any(r.get("msg", "").startswith("NodeConfig host001 refused") for r in agent.records())
    )
    refusal = next(r for r in agent.records() if r.get("msg", "").startswith("NodeConfig host001 refused"))
    assert (refusal["field"], refusal["value"]) == ("spec.cidr6", "'2001:db8:0:1::/200'")
    status, body = agent.get("/readyz")
    assert status == 200 and "update refused" in body and "serving with the previous one" in body, body
    assert _metric(agent, "flock_nodeconfig_refused") == 1.0
    assert _add(lab, "c0ffee02", "web-1") in ipaddress.ip_network(CIDR6)

    lab.api.delete(NODECONFIGS, NODE)
    wait_for("the deletion", lambda: _metric(agent, "flock_nodeconfig_deleted") == 1.0)
    status, body = agent.get("/readyz")
    # Readiness says so, ADD waits (11), existing pods keep working.
    assert status == 503 and f"NodeConfig {NODE} was deleted; existing pods keep the last one" in body, body
    assert set(routes) <= set(lab.flock_routes())  # no route dropped
    refused = lab.cni("ADD", "c0ffee03", lab.pool.create("pod"), "web-2")
    assert refused.code == 11 and "was deleted" in refused.json["details"], refused
    assert lab.cni("STATUS").code == 50
    assert {a.ip6 for a in lab.rows().values()} >= {first}

    lab.api.create(NODECONFIGS, nodeconfig_object(NODE, CIDR6, cidr4=CIDR4))
    wait_for("the recreation", lambda: _metric(agent, "flock_nodeconfig_deleted") == 0.0)
    assert agent.get("/readyz") == (200, "ready\n")
    assert _metric(agent, "flock_nodeconfig_refused") == 0.0
    assert _add(lab, "c0ffee04", "web-3") in ipaddress.ip_network(CIDR6)


@pytest.fixture
def bird_lab(tmp_path, require_bird):
    with open_lab(tmp_path, "fl-fault-", bird=True) as lab:
        yield lab


def test_without_bird_add_is_served_and_the_config_is_applied_once_bird_comes_up(bird_lab):
    lab = bird_lab
    lab.stop_bird()  # no BIRD and no control socket when the agent starts
    agent = lab.agent()
    agent.wait_ready()
    _add(lab, "c0ffee01", "web-0")
    wait_for("the BIRD note", lambda: _metric(agent, "flock_bird_pending") == 1.0)
    status, body = agent.get("/readyz")
    assert (
        status == 200 and f"BIRD not configured yet (retrying): configure: birdc -s {lab.bird_socket} configure" in body
    ), body
    assert _metric(agent, "flock_bird_reloads_total") == 0.0

    lab.start_bird()  # on the config the agent rendered and checked meanwhile
    wait_for("the retried configure", lambda: _metric(agent, "flock_bird_pending") == 0.0, 40)
    assert _metric(agent, "flock_bird_reloads_total") == 1.0
    assert agent.get("/readyz") == (200, "ready\n")
    assert "tor1" in lab.birdc("show", "protocols")


def _ips(outcome) -> list[str]:
    return [i["address"] for i in outcome.json["ips"]]


def test_sigterm_with_adds_in_flight_loses_and_duplicates_nothing(lab):
    pods = [f"web-{i}" for i in range(6)]
    for i, pod in enumerate(pods):  # the lab's IPv4 block has 5 addresses
        lab.api.create(
            PODS, pod_object("default", pod, NODE, annotations={"flock.fritzlab.net/ipv4": str(i < 4).lower()})
        )
    netns = {pod: lab.pool.create(pod) for pod in [*pods, "late-0"]}
    cids = {pod: f"c0ffee{i:02x}" for i, pod in enumerate(netns)}
    agent = lab.agent()
    agent.wait_ready()

    with concurrent.futures.ThreadPoolExecutor(len(netns)) as pool:
        # late-0 is not on the API server yet: its ADD is still waiting when the drain ends.
        futures = {pod: pool.submit(lab.cni, "ADD", cids[pod], netns[pod], pod) for pod in netns}
        wait_for("ADDs in flight", lambda: sum(r.get("op") == "ADD" for r in agent.records()) >= 3)
        # late-0's request must have reached the agent (not merely be on its way), or the
        # SIGTERM finds it unconnected and it hears "not reachable" instead of "shutting down".
        wait_for("late-0 in the agent", lambda: any(r.get("container_id") == cids["late-0"] for r in agent.records()))
        agent.proc.send_signal(signal.SIGTERM)
        first = {pod: f.result() for pod, f in futures.items()}
    assert agent.wait_exit() == 0
    for pod, out in first.items():
        assert out.status == 0 or out.code == 11, (pod, out)
    assert first["late-0"].json["msg"] == "flock-agent is shutting down", first["late-0"]  # not "unreachable"
    before = {cid: a for cid, a in lab.rows().items()}

    lab.api.create(PODS, pod_object("default", "late-0", NODE))
    agent = lab.agent()
    agent.wait_ready()
    retried = {pod: lab.cni("ADD", cids[pod], netns[pod], pod) for pod in netns}
    for pod, out in retried.items():
        assert out.status == 0, (pod, out)
        if first[pod].status == 0:
            assert _ips(out) == _ips(first[pod]), pod  # committed before the signal: the same
        if cids[pod] in before:
            assert {ipaddress.ip_interface(a).ip for a in _ips(out)} >= {before[cids[pod]].ip6}, pod  # pending: reused
    every = [a for out in retried.values() for a in _ips(out)]
    assert len(every) == len(set(every))
    assert {a.state for a in lab.rows().values()} == {AllocationState.COMMITTED} and len(lab.rows()) == len(netns)
    assert len(lab.flock_links()) == len(netns)


def test_three_sigkill_restarts_in_a_row_keep_every_pod_and_address(lab):
    pods = [f"web-{i}" for i in range(4)]
    for pod in pods:
        lab.api.create(PODS, pod_object("default", pod, NODE, annotations={"flock.fritzlab.net/ipv4": "true"}))
    netns = {pod: lab.pool.create(pod) for pod in pods}
    agent = lab.agent()
    agent.wait_ready()
    first = {pod: _ips(lab.cni("ADD", f"c0ffee{i:02x}", netns[pod], pod)) for i, pod in enumerate(pods)}
    links, routes = lab.flock_links(), lab.flock_routes()
    for _ in range(3):
        agent.kill()
        agent = lab.agent()
        # Killed again as soon as it answers: no time to settle.
        wait_for("the socket", lambda: lab.cni("STATUS").status in (0, 1) and lab.socket.exists())
    agent.wait_ready()
    assert {pod: _ips(lab.cni("ADD", f"c0ffee{i:02x}", netns[pod], pod)) for i, pod in enumerate(pods)} == first
    assert lab.flock_links() == links and lab.flock_routes() == routes
    assert len(lab.rows()) == len(pods)
    fresh = lab.pool.create("web-9")
    lab.api.create(PODS, pod_object("default", "web-9", NODE, annotations={"flock.fritzlab.net/ipv4": "true"}))
    extra = _ips(lab.cni("ADD", "c0ffee99", fresh, "web-9"))
    assert not set(extra) & {a for ips in first.values() for a in ips}  # nothing handed out twice


def test_every_request_log_line_names_container_pod_and_op(lab):
    agent = lab.agent()
    agent.wait_ready()
    served_from = len(agent.records())
    _add(lab, "c0ffee01", "web-0")
    assert lab.cni("ADD", "c0ffee01", lab.pool.create("again"), "web-1").status == 1  # same container, other pod
    assert lab.cni("ADD", "c0ffee02", lab.pool.create("bad"), "Bad_Name").code == 4
    assert lab.cni("DEL", "c0ffee01", pod="web-0").status == 0
    lines = [r for r in agent.records()[served_from:] if r["logger"] in ("flock.pods", "flock.rpc", "flock.netlink")]
    assert {r["msg"] for r in lines} >= {"pod network ready", "pod network removed", "request served", "request failed"}
    for r in lines:
        assert (
            r.get("op") in ("ADD", "DEL")
            and r.get("container_id", "").startswith("c0ffee")
            and r.get("pod", "").startswith("default/")
        ), r


def test_read_only_state_dir_exits_at_once(lab):
    lab.state_dir.mkdir(mode=0o700)
    # A read-only bind mount in a private mount namespace: the host's mounts are untouched.
    ro = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount --bind "{lab.state_dir}" "{lab.state_dir}" && mount -o remount,bind,ro "{lab.state_dir}" && exec "$@"',
        "sh",
    ]
    line = _fatal_exit(lab.agent(prefix=ro))
    assert (
        line == f"flock-agent: fatal: state directory {lab.state_dir}: not writable (read-only mount?); "
        "mount a writable directory there or pass --state-dir"
    )
