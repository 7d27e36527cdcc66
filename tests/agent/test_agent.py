"""flock-agent in-process: composition, shutdown, escalation at the root, CLI."""

import os
import signal
import stat

import attrs
import pytest
import trio
import trio.testing

from flock.agent import EXIT_ESCALATED, Agent, AgentSettings, compose, parse_args, run_agent, serve
from flock.ctl import ask
from flock.errors import CniError
from flock.nursery import Backoff, ChildSpec, RestartIntensity
from flock.rpc import Request, decode_response
from flock.testing.pods import MemoryAllocations


async def status(path) -> bytes:
    sock = trio.socket.socket(trio.socket.AF_UNIX)
    await sock.connect(str(path))
    async with trio.SocketStream(sock) as stream:
        await stream.send_all(Request("STATUS", config={"cniVersion": "1.1.0"}).encode())
        data = b""
        while chunk := await stream.receive_some(4096):
            data += chunk
    return data


def in_tmp(tmp_path, *flags: str) -> AgentSettings:
    """The agent's settings from its flags, with the socket and state under *tmp_path*."""
    sock, state = tmp_path / "run" / "flock.sock", tmp_path / "state"
    argv = ["--node", "host001", "--socket", str(sock), "--state-dir", str(state), "--health-address", "127.0.0.1:0"]
    return parse_args([*argv, *flags], {})[0]


async def test_agent_without_an_api_server_serves_status_then_shuts_down_cleanly(tmp_path):
    config = in_tmp(tmp_path, "--no-bird", "--kubeconfig", "/dev/null")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_agent, config)
            # The tree never reports started (no API server): watch for the socket instead.
            while not config.socket.exists():  # noqa: ASYNC110
                await trio.sleep(0.01)
            assert (tmp_path / "state" / "flock.db").is_file()
            with pytest.raises(CniError) as info:
                decode_response(await status(config.socket))
            assert (info.value.code, info.value.msg) == (50, "agent not ready")
            # flockctl's view works without an API server and says what the node waits for.
            admin = config.socket.parent / "admin.sock"
            while not admin.exists():  # noqa: ASYNC110  (started after rpc and health)
                await trio.sleep(0.01)
            assert stat.S_IMODE(admin.stat().st_mode) == 0o600
            seen = await trio.to_thread.run_sync(ask, admin, "status")
            assert not seen["ready"] and "NodeConfig host001 not loaded" in seen["not_ready"], seen
            os.kill(os.getpid(), signal.SIGTERM)
    assert not config.socket.exists() and not admin.exists()


def test_compose_builds_the_tree_in_order_with_every_dependency_passed(tmp_path):
    names = [c.name for c in compose(in_tmp(tmp_path), store=MemoryAllocations()).children]
    assert names == [
        "signals",
        "startup",
        "removals",
        "rpc",
        "health",
        "pods",
        "admin",
        "api",
        "policy",
        "policy-log",
        "services",  # off by default: it only removes table inet flock-services
        "wireguard",  # off by default: it only removes table inet flock-wireguard
        "bird",
        "bgp-sessions",
    ]
    on = attrs.evolve(in_tmp(tmp_path), service_proxy=True)
    names = [c.name for c in compose(on, store=MemoryAllocations()).children]
    assert names[names.index("policy-log") + 1 :][:2] == ["services", "health-checks"]
    names = [c.name for c in compose(in_tmp(tmp_path, "--no-bird"), store=MemoryAllocations()).children]
    assert names[-3:] == ["policy-log", "services", "wireguard"]
    encrypting = compose(in_tmp(tmp_path, "--encryption", "wireguard"), store=MemoryAllocations())
    wireguard = next(c for c in encrypting.children if c.name == "wireguard")
    assert type(getattr(wireguard.fn, "__self__", None)).__name__ == "WireGuardService"


def test_child_names_are_unique(tmp_path):
    async def noop(*, task_status):
        task_status.started()

    with pytest.raises(ValueError):
        Agent([ChildSpec("rpc", noop), ChildSpec("rpc", noop)])
    with pytest.raises(ValueError):
        Agent([ChildSpec("signals", noop)])


def test_escalation_at_the_root_is_a_nonzero_exit(tmp_path):
    async def broken(*, task_status):
        task_status.started()
        raise OSError("netlink socket closed")

    agent = Agent(
        [ChildSpec("netlink", broken, backoff=Backoff(initial=1.0))],
        intensity=RestartIntensity(max_restarts=2, period=60.0),
    )
    assert serve(agent.run, clock=trio.testing.MockClock(autojump_threshold=0)) == EXIT_ESCALATED


async def test_shutdown_drains_in_order_then_cancels_the_tree():
    drained = []

    async def drain(name):
        drained.append(name)

    async def forever(*, task_status):
        task_status.started()
        await trio.sleep_forever()

    agent = Agent([ChildSpec("a", forever)], drains=[lambda: drain("rpc"), lambda: drain("other")])
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            await agent.shutdown()
    assert drained == ["rpc", "other"]


def test_cli(tmp_path):
    s, args = parse_args(["--socket", str(tmp_path / "s.sock"), "--state-dir", str(tmp_path)], {"NODE_NAME": "host007"})
    assert s.node == "host007" and s.socket == tmp_path / "s.sock" and s.kubeconfig is None
    assert args.log_format == "json"
    s, _ = parse_args(["--node", "a", "--log-format", "text"], {"NODE_NAME": "b"})
    assert s.node == "a"
    for bad in (["--socket", "rel.sock", "--node", "x"], [], ["--node", "x", "--kubeconfig", str(tmp_path / "none")]):
        with pytest.raises(SystemExit) as info:
            parse_args(bad, {})
        assert info.value.code == 2
    # WireGuard's table and rule priority: the kernel's own tables and priorities at or after main's refused
    s, _ = parse_args(["--node", "a", "--wireguard-table", "200", "--wireguard-rule-priority", "50"], {})
    assert (s.wireguard_table, s.wireguard_rule_priority) == (200, 50)
    assert (AgentSettings(node="a").wireguard_table, AgentSettings(node="a").wireguard_rule_priority) == (71, 99)
    # the plaintext allowance from the environment (the DaemonSet), flags added to it
    s, _ = parse_args(["--node", "a", "--allow-plaintext-to", "n9"], {"FLOCK_ALLOW_PLAINTEXT_TO": " *, n3 ,"})
    assert s.allow_plaintext_to == ("*", "n3", "n9")
    assert parse_args(["--node", "a"], {})[0].allow_plaintext_to == ()
    for flag, value in (("table", "254"), ("table", "0"), ("rule-priority", "32766"), ("rule-priority", "0")):
        with pytest.raises(SystemExit):
            parse_args(["--node", "a", f"--wireguard-{flag}", value], {})
