"""flock-agent in-process: composition, shutdown, escalation at the root, CLI."""

import os
import signal

import pytest
import trio
import trio.testing

from flock.agent import EXIT_ESCALATED, Agent, AgentSettings, parse_args, serve
from flock.errors import CniError
from flock.nursery import Backoff, ChildSpec, RestartIntensity
from flock.rpc import Request, decode_response


async def status(path) -> bytes:
    sock = trio.socket.socket(trio.socket.AF_UNIX)
    await sock.connect(str(path))
    async with trio.SocketStream(sock) as stream:
        await stream.send_all(Request("STATUS", config={"cniVersion": "1.1.0"}).encode())
        data = b""
        while chunk := await stream.receive_some(4096):
            data += chunk
    return data


def settings(tmp_path):
    return AgentSettings(node="host001", socket=tmp_path / "run" / "flock.sock", state_dir=tmp_path / "state")


async def test_agent_serves_then_shuts_down_cleanly(tmp_path):
    agent = Agent(settings(tmp_path))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            assert [c.name for c in agent.children] == ["signals", "rpc"]
            assert (tmp_path / "state").is_dir()
            with pytest.raises(CniError) as info:
                decode_response(await status(agent.settings.socket))
            assert info.value.code == 50
            await agent.shutdown()
    assert not agent.settings.socket.exists()


async def test_sigterm_to_ourselves_drains_and_returns(tmp_path):
    agent = Agent(settings(tmp_path))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            os.kill(os.getpid(), signal.SIGTERM)
    assert not agent.settings.socket.exists()


def test_children_are_added_in_order(tmp_path):
    async def noop(*, task_status):
        task_status.started()

    agent = Agent(settings(tmp_path))
    agent.add_child(ChildSpec("bird", noop))
    agent.add_child(ChildSpec("store", noop), before="rpc")
    assert [c.name for c in agent.children] == ["signals", "store", "rpc", "bird"]
    with pytest.raises(ValueError):
        agent.add_child(ChildSpec("rpc", noop))


def test_escalation_at_the_root_is_a_nonzero_exit(tmp_path):
    async def broken(*, task_status):
        task_status.started()
        raise OSError("netlink socket closed")

    agent = Agent(settings(tmp_path), intensity=RestartIntensity(max_restarts=2, period=60.0))
    agent.add_child(ChildSpec("netlink", broken, backoff=Backoff(initial=1.0)))
    assert serve(agent, clock=trio.testing.MockClock(autojump_threshold=0)) == EXIT_ESCALATED
    assert not agent.settings.socket.exists()


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
