"""The agent's RPC server over real unix sockets, deadlines in virtual time."""

import io
import json
import logging
import os
import socket
import stat

import attrs
import pytest
import trio
import trio.testing

from flock import logs
from flock.errors import CniError
from flock.rpc import Request, decode_response
from flock.rpc.server import RpcServer, SocketInUse


def req(op="ADD", cid="c0ffee", **over):
    return Request(
        op=op,
        container_id=cid,
        netns="/var/run/netns/t",
        if_name="eth0",
        args="K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web-0",
        config={"cniVersion": "1.1.0"},
        **over,
    )


async def exchange(path, payload: bytes) -> bytes:
    """Send *payload*, return everything the server sends until it closes."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.connect(str(path))
    received = []

    async def send(stream):
        try:
            await stream.send_all(payload)
        except trio.BrokenResourceError:
            pass  # the server stopped listening to a flood; its answer is still readable

    async with trio.SocketStream(sock) as stream, trio.open_nursery() as nursery:
        nursery.start_soon(send, stream)
        while chunk := await stream.receive_some(65536):
            received.append(chunk)
    return b"".join(received)


async def call(path, request: Request) -> dict:
    return decode_response(await exchange(path, request.encode()))


async def code_of(path, payload: bytes) -> int:
    with pytest.raises(CniError) as info:
        decode_response(await exchange(path, payload))
    return info.value.code


@pytest.fixture
def io_autojump_clock():
    """autojump_clock for tests that also do real socket I/O: the clock jumps
    only after 20 ms of real idleness, so a reply in flight in the kernel is
    never overtaken by a jump (threshold 0 races with I/O wake-ups)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


@pytest.fixture
def sock_path(tmp_path):
    return tmp_path / "run" / "flock.sock"


async def test_default_handler_answers_every_op(sock_path):
    server = RpcServer(sock_path)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            assert await code_of(sock_path, req("ADD").encode()) == 11
            assert await code_of(sock_path, req("STATUS", cid="").encode()) == 50
            for op in ("DEL", "CHECK", "GC"):
                assert await call(sock_path, req(op)) == {}
            nursery.cancel_scope.cancel()
    assert not sock_path.exists()


async def test_socket_and_directory_permissions(sock_path):
    server = RpcServer(sock_path)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            assert stat.S_ISSOCK(sock_path.stat().st_mode)
            assert stat.S_IMODE(sock_path.stat().st_mode) == 0o600
            assert stat.S_IMODE(sock_path.parent.stat().st_mode) == 0o700
            assert os.listdir(sock_path.parent) == ["flock.sock"]
            nursery.cancel_scope.cancel()


async def test_existing_loose_directory_is_tightened(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(RpcServer(loose / "flock.sock").run)
            assert stat.S_IMODE(loose.stat().st_mode) == 0o700
            nursery.cancel_scope.cancel()


async def test_the_handler_is_given_at_construction_and_its_bugs_stay_in_the_request(sock_path):

    async def ready(request):
        if request.op == "CHECK":
            raise KeyError("oops")
        if request.op == "GC":
            return ["not", "an", "object"]
        return {"cniVersion": "1.1.0", "ips": [{"address": "2001:db8::5/128"}], "seen": request.pod}

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(RpcServer(sock_path).run)  # no handler: ADD is "try again later"
            assert await code_of(sock_path, req().encode()) == 11
            nursery.cancel_scope.cancel()
        server = RpcServer(sock_path, handler=ready)
        with pytest.raises(attrs.exceptions.FrozenAttributeError):
            server.handler = ready  # wired once, by the composition root
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            assert (await call(sock_path, req()))["seen"] == "prod/web-0"
            assert await code_of(sock_path, req("CHECK").encode()) == 100
            assert await code_of(sock_path, req("GC").encode()) == 100
            assert (await call(sock_path, req()))["ips"][0]["address"] == "2001:db8::5/128"
            nursery.cancel_scope.cancel()


async def test_stale_socket_is_replaced(sock_path):
    sock_path.parent.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(sock_path))  # bound, never listening: what a crashed agent leaves
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(RpcServer(sock_path).run)
            assert await call(sock_path, req("DEL")) == {}
            nursery.cancel_scope.cancel()


async def test_refuses_to_start_over_a_live_agent_or_a_file(sock_path, tmp_path):
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(RpcServer(sock_path).run)
            with pytest.raises(SocketInUse, match="another flock-agent"):
                await RpcServer(sock_path).run()
            assert await call(sock_path, req("DEL")) == {}  # the first one is untouched
            nursery.cancel_scope.cancel()
    plain = tmp_path / "plain"
    plain.write_text("not a socket")
    with trio.fail_after(10):
        with pytest.raises(SocketInUse, match="not a socket"):
            await RpcServer(plain).run()
    assert plain.read_text() == "not a socket"


async def test_garbage_never_takes_the_server_down(sock_path):
    server = RpcServer(sock_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            assert await code_of(sock_path, b"x" * (2 << 20)) == 6
            assert await code_of(sock_path, b"{not json}\n") == 6
            assert await code_of(sock_path, b'{"version": 9, "op": "ADD"}\n') == 202
            assert await code_of(sock_path, b'{"version": 1, "op": "FROB", "config": {}}\n') == 4
            # Half a line, then hang up.
            half = trio.socket.socket(trio.socket.AF_UNIX)
            await half.connect(str(sock_path))
            await half.send(b'{"version": 1, "op"')
            half.shutdown(socket.SHUT_WR)
            assert await trio.SocketStream(half).receive_some(65536) != b""
            half.close()
            # Connect and close at once.
            gone = trio.socket.socket(trio.socket.AF_UNIX)
            await gone.connect(str(sock_path))
            gone.close()
            assert await call(sock_path, req("DEL")) == {}
            nursery.cancel_scope.cancel()


async def test_silent_client_is_dropped_at_the_read_deadline_and_blocks_nobody(sock_path, io_autojump_clock):
    server = RpcServer(sock_path, read_deadline=5.0)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            silent = trio.socket.socket(trio.socket.AF_UNIX)
            await silent.connect(str(sock_path))
            assert await call(sock_path, req("DEL")) == {}
            assert trio.current_time() == 0.0
            assert await trio.SocketStream(silent).receive_some(10) == b""
            assert trio.current_time() == 5.0
            silent.close()
            nursery.cancel_scope.cancel()


async def test_handler_past_the_request_deadline_answers_11(sock_path, io_autojump_clock):
    async def stuck(request):
        await trio.sleep_forever()

    server = RpcServer(sock_path, handler=stuck, request_deadline=30.0)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            with pytest.raises(CniError) as info:
                await call(sock_path, req())
            assert info.value.code == 11 and "30 s" in info.value.details
            assert trio.current_time() == 30.0
            nursery.cancel_scope.cancel()


async def test_drain_finishes_in_flight_requests_then_removes_the_socket(sock_path, io_autojump_clock):
    async def slow(request):
        await trio.sleep(1.0 if request.container_id == "quick" else 100.0)
        return {"id": request.container_id}

    server = RpcServer(sock_path, handler=slow, drain_deadline=2.0)
    outcomes = {}

    async def client(cid):
        try:
            outcomes[cid] = await call(sock_path, req("DEL", cid=cid))
        except CniError as err:
            outcomes[cid] = err.code

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            silent = trio.socket.socket(trio.socket.AF_UNIX)
            await silent.connect(str(sock_path))
            nursery.start_soon(client, "quick")
            nursery.start_soon(client, "slowpoke")
            await trio.sleep(0.5)
            await server.drain()
            assert trio.current_time() == 2.5  # the slow one was cut at the drain deadline
            assert not sock_path.exists()
            assert await trio.SocketStream(silent).receive_some(10) == b""
            silent.close()
            nursery.cancel_scope.cancel()
    assert outcomes["quick"] == {"id": "quick"}
    assert "slowpoke" not in outcomes or outcomes["slowpoke"] != {"id": "slowpoke"}


async def test_each_request_is_logged_with_its_context(sock_path):
    stream = io.StringIO()
    saved = logging.getLogger().handlers[:]
    logs.configure(level="info", fmt="json", stream=stream)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(RpcServer(sock_path).run)
                await code_of(sock_path, req("ADD", cid="abc123").encode())
                nursery.cancel_scope.cancel()
    finally:
        logging.getLogger().handlers[:] = saved
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    served = [r for r in records if r.get("op") == "ADD"]
    assert served and served[0]["container_id"] == "abc123" and served[0]["pod"] == "prod/web-0"
    assert served[0]["code"] == 11
