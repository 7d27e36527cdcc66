"""The API link in virtual time: configuration retried with backoff, watchers
publishing into NodeState, readiness gates, pod lookups only while the watcher runs."""

from __future__ import annotations

import contextlib

import attrs
import pytest
import trio

from flock.agent import API_GATE, ApiLink, node_state
from flock.nursery import ChildSpec
from flock.pods import NotReady, PodLookupFailed
from flock.testing import NODECONFIGS, PODS, ObjectStore, StoreSource, nodeconfig_object, pod_object
from flock.watchers import ClientConfigError, TransientKubeError

NODE = "host001"


@attrs.frozen
class StoreClient:
    """What the link asks of a KubeClient, over the flock/testing API store."""

    api: ObjectStore

    def nodeconfig(self, name: str) -> StoreSource:
        return StoreSource(self.api, NODECONFIGS, f"metadata.name={name}")

    def pods_on_node(self, node: str) -> StoreSource:
        return FailingGets(self.api, PODS, f"spec.nodeName={node}")


class FailingGets(StoreSource):
    async def get(self, namespace, name):
        raise TransientKubeError("pods on host001: connection refused")


async def test_config_is_retried_then_watchers_publish_and_lookups_work(autojump_clock):
    api = ObjectStore()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    api.create(PODS, pod_object("default", "web-0", NODE))
    attempts: list[float] = []

    @contextlib.asynccontextmanager
    async def connect(kubeconfig):
        attempts.append(trio.current_time())
        if len(attempts) < 3:
            raise ClientConfigError("token file /var/run/secrets/…/token: missing")
        yield StoreClient(api)

    extra_clients = []

    def more_watchers(client):
        async def extra(*, task_status=trio.TASK_STATUS_IGNORED):
            extra_clients.append(client)
            task_status.started()
            await trio.sleep_forever()

        return [ChildSpec("networkpolicy-watcher", extra)]

    state = node_state(NODE)
    link = ApiLink(NODE, None, state, watchers=[more_watchers], connect=connect)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            await trio.sleep(0.5)
            assert state.reason(API_GATE.name).startswith("no API server configuration: token file")
            with pytest.raises(NotReady):
                await link.lookup("default", "web-0")
            await trio.sleep(3)
            assert attempts == [0.0, 1.0, 3.0]  # backoff 1 s, 2 s
            assert extra_clients == [StoreClient(api)]  # a watcher added on the same connection
            assert state.not_ready() == ["ADD not served: start-up has not finished"]  # only the bring-up's gate
            assert str(state.nodeconfig.cidr6) == "2001:db8:0:1::/64"
            assert (await link.lookup("default", "web-0")).name == "web-0"
            with pytest.raises(PodLookupFailed, match="connection refused"):
                await link.fetch_pod("default", "web-0")
            nursery.cancel_scope.cancel()
    # Stopped: the informers' gates are closed again and lookups refused.
    assert "pod informer not synced" in state.not_ready()
    with pytest.raises(NotReady):
        await link.lookup("default", "web-0")
