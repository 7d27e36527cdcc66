"""Operational failures in virtual time, in process: the pod handler and the
pod watcher against the flock/testing API store when the API server misbehaves."""

from __future__ import annotations

import pytest
import trio

from flock import errors
from flock.agent import PodWatcherLookup
from flock.apiserver import PODS, ObjectStore, nodeconfig_object, pod_object
from flock.model import NodeConfig
from flock.pods import POD_LOOKUP_DEADLINE_S
from flock.testing import StoreSource
from flock.testing.pods import MemoryAllocations, MemoryKernel, request, serving_handler
from flock.watchers import PodWatcher, TransientKubeError

NODE = "host001"
NODE_CONFIG = NodeConfig.from_object(nodeconfig_object(NODE, "2001:db8:0:1::/64"))


class TroubledGets(StoreSource):
    """The list and watch work (the informer is synced); direct GETs fail as *mode* says."""

    mode: str = "hang"

    async def get(self, namespace, name):
        self.gets.append((namespace, name))
        if self.mode == "hang":  # a paused API server: connection accepted, no answer
            await trio.sleep_forever()
        raise TransientKubeError("pods on host001: ClientConnectorError: Cannot connect to host")


@pytest.mark.parametrize(
    ("mode", "msg", "at"),
    [
        ("hang", "the API server did not answer", POD_LOOKUP_DEADLINE_S),
        ("refused", "cannot read the pod from the API server", 3.0),  # the informer wait, then the failed GET
    ],
)
async def test_add_for_a_pod_the_cache_lacks_is_11_when_the_api_server_fails(autojump_clock, mode, msg, at):
    source = TroubledGets(ObjectStore(), PODS, f"spec.nodeName={NODE}")
    source.mode = mode
    watcher = PodWatcher(source, NODE)
    rows, kernel = MemoryAllocations(), MemoryKernel()
    handler = await serving_handler(PodWatcherLookup(watcher), NODE_CONFIG, rows=rows, kernel=kernel)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD"))
            nursery.cancel_scope.cancel()
    assert trio.current_time() == at == (10.0 if mode == "hang" else 3.0)
    assert (info.value.code, info.value.msg) == (errors.TRY_AGAIN_LATER, msg)
    assert info.value.details.startswith("pod default/web-0: ")
    # Nothing reserved: no row, no addresses held, no kernel state.
    assert rows.rows == {} and set(handler.ipam.allocator.containers()) == set() and handler.locks_in_use == 0
    assert source.gets == [("default", "web-0")]


async def test_a_late_pod_is_served_once_the_api_server_answers_again(autojump_clock):
    api = ObjectStore()
    source = TroubledGets(api, PODS, f"spec.nodeName={NODE}")
    watcher = PodWatcher(source, NODE)
    handler = await serving_handler(PodWatcherLookup(watcher), NODE_CONFIG)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            with pytest.raises(errors.CniError):
                await handler(request("ADD"))
            # The kubelet retries; meanwhile the watch delivers the pod.
            api.create(PODS, pod_object("default", "web-0", NODE))
            result = await handler(request("ADD"))
            nursery.cancel_scope.cancel()
    assert trio.current_time() == POD_LOOKUP_DEADLINE_S
    assert [ip["address"].endswith("/128") for ip in result["ips"]] == [True]
