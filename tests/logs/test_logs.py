import io
import json
import logging

import pytest
import trio

from flock import logs


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


async def test_json_lines_carry_context_into_child_tasks(restore_root_logger):
    stream = io.StringIO()
    logs.configure(level="debug", fmt="json", stream=stream)
    log = logging.getLogger("flock.test")

    async def child():
        log.info("in child", extra={"step": "netlink"})

    with logs.bound(container_id="abc123", pod="default/web-0", op="ADD"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
    log.warning("outside")

    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "in child"
    assert first["container_id"] == "abc123"
    assert first["pod"] == "default/web-0"
    assert first["op"] == "ADD"
    assert first["step"] == "netlink"
    assert first["level"] == "info"
    assert "container_id" not in second
