"""The WireGuard service's API side in virtual time: every NodeConfig and Node read into the cluster view,
this node's public key published to its NodeConfig's status (merge patch on the status subresource), again
after a rotation and whenever the NodeConfig says another key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio

from flock.agent._wireguard import NODECONFIG_PATH, ClusterView, KeyPublisher, _Latest, cluster_watchers
from flock.apiserver import NODECONFIGS, NODES, ApiServer, ObjectStore, node_object, nodeconfig_object
from flock.testing import StoreSource
from flock.watchers import KubeApiError, open_kube_client
from flock.wireguard import PrivateKey, PublicKey

NODE = "host001"
KEYS = [PrivateKey.generate().public_key for _ in range(3)]


@attrs.define(eq=False)
class Keys:
    """This node's key as the service's device carries it (set: the first pass, a rotation applied)."""

    latest: _Latest = attrs.field(factory=_Latest)

    @property
    def device_key(self) -> PublicKey | None:
        return self.latest.value

    def set(self, key: PublicKey) -> None:
        self.latest.set(key)

    async def wait_device_key(self, seen: PublicKey | None) -> PublicKey:
        return await self.latest.wait_other(seen)


async def publish_once(keys: Keys, patch: Callable[[str, dict[str, Any]], Any]) -> None:
    """An agent's publisher started, until it has published once, then stopped."""
    async with trio.open_nursery() as nursery:
        publisher = KeyPublisher(NODE, keys, ClusterView(), patch)
        await nursery.start(publisher.run)  # at once: the key comes from a service started later
        while not publisher.published:  # noqa: ASYNC110 (a counter, no event to wait on)
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


@attrs.define
class StoreClient:
    """What the WireGuard watchers ask of a KubeClient, over the API store; PATCHes recorded."""

    api: ObjectStore
    patches: list[tuple[float, str, str, Any]] = attrs.field(factory=list)

    def nodeconfigs(self) -> StoreSource:
        return StoreSource(self.api, NODECONFIGS)

    def nodes(self) -> StoreSource:
        return StoreSource(self.api, NODES)

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        self.patches.append((trio.current_time(), method, path, content_type))
        *_, name, subresource = path.split("/")
        assert method == "PATCH" and subresource == "status" and content_type == "application/merge-patch+json"
        try:
            old = self.api.get(NODECONFIGS, name)
        except Exception:
            raise KubeApiError(404, "NotFound", f"nodeconfigs {name} not found") from None
        return self.api.set_status(NODECONFIGS, name, {**(old.get("status") or {}), **body["status"]})


def published(api: ObjectStore) -> str | None:
    return ((api.get(NODECONFIGS, NODE).get("status") or {}).get("wireguard") or {}).get("publicKey")


async def test_published_at_start_after_rotation_and_when_overwritten(autojump_clock) -> None:
    api = ObjectStore()
    api.create(NODECONFIGS, nodeconfig_object("host002", "2001:db8:0:2::/64", cidr4="10.0.2.0/24"))
    api.create(NODES, node_object("host002", addresses=[("InternalIP", "2001:db8::2")]))
    client = StoreClient(api)
    keys, cluster = Keys(), ClusterView()
    children = cluster_watchers(NODE, keys, cluster)(client)  # type: ignore[arg-type]
    assert [c.name for c in children] == ["wireguard-nodeconfigs", "wireguard-nodes", "wireguard-publish"]
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            for child in children:
                nursery.start_soon(child.fn)
            await trio.sleep(0.5)
            assert cluster.listed and set(cluster.nodeconfigs) == {"host002"} and set(cluster.nodes) == {"host002"}
            assert cluster.nodes["host002"].addresses[0].compressed == "2001:db8::2"
            assert client.patches == []  # no key yet: nothing published
            keys.set(KEYS[0])
            await trio.sleep(2)  # this node's NodeConfig does not exist yet: 404, retried at 1 s, 2 s
            assert [t for t, *_ in client.patches] == [0.5, 1.5]
            api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
            await trio.sleep(2)
            assert [t for t, *_ in client.patches] == [0.5, 1.5, 3.5]  # the retry after 2 s
            assert published(api) == KEYS[0].base64
            assert cluster.nodeconfigs[NODE].public_key == KEYS[0]
            keys.set(KEYS[1])  # a rotation: published at once
            await trio.sleep(0.1)
            assert published(api) == KEYS[1].base64 and len(client.patches) == 4
            api.set_status(NODECONFIGS, NODE, {"wireguard": {"publicKey": KEYS[2].base64}})  # someone else's
            await trio.sleep(0.1)
            assert published(api) == KEYS[1].base64 and len(client.patches) == 5
            await trio.sleep(100)  # nothing changes: nothing is written
            assert len(client.patches) == 5
            nursery.cancel_scope.cancel()


async def test_publisher_republishes_at_every_start(autojump_clock) -> None:
    api = ObjectStore()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    api.set_status(NODECONFIGS, NODE, {"wireguard": {"publicKey": KEYS[0].base64}, "other": "kept"})
    client = StoreClient(api)
    keys = Keys()
    keys.set(KEYS[0])

    async def patch(path: str, body: dict[str, Any]) -> Any:
        return await client.request("PATCH", path, body, "application/merge-patch+json")

    with trio.fail_after(10):
        for _ in range(2):  # two agent starts, the same key: the same merge patch, idempotent
            await publish_once(keys, patch)
    assert len(client.patches) == 2 and published(api) == KEYS[0].base64
    assert api.get(NODECONFIGS, NODE)["status"]["other"] == "kept"  # a merge: the rest of status stays


async def test_over_http_a_node_s_token_writes_its_own_status_only(tmp_path) -> None:
    """The lab's API server enforces deploy/admission-nodeconfig-status.yaml's policy: a token bound to
    host001 (its node-name claim) publishes host001's key with a merge patch, and is refused on host002's."""
    tokens = {"token-host001": NODE, "token-host002": "host002"}
    with trio.fail_after(30), ApiServer(tokens=frozenset({"admin"}), token_nodes=tokens) as api:
        for name in (NODE, "host002"):
            api.create(NODECONFIGS, nodeconfig_object(name, "2001:db8:0:1::/64"))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc", "token-host001")) as kube:
            keys = Keys()
            keys.set(KEYS[0])

            async def patch(path: str, body: dict[str, Any]) -> Any:
                return await kube.request("PATCH", path, body, content_type="application/merge-patch+json")

            await publish_once(keys, patch)
            assert published(api.store) == KEYS[0].base64
            with pytest.raises(KubeApiError) as refused:
                await patch(
                    f"{NODECONFIG_PATH}/host002/status", {"status": {"wireguard": {"publicKey": KEYS[1].base64}}}
                )
            assert refused.value.status == 403 and "its own node's NodeConfig only" in str(refused.value)
            assert "wireguard" not in (api.store.get(NODECONFIGS, "host002").get("status") or {})
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc-admin", "admin")) as kube:
            # a token bound to no node (an administrator's) is not the policy's concern
            await kube.request(
                "PATCH",
                f"{NODECONFIG_PATH}/host002/status",
                {"status": {"wireguard": {"publicKey": KEYS[1].base64}}},
                content_type="application/merge-patch+json",
            )
        assert api.store.get(NODECONFIGS, "host002")["status"]["wireguard"]["publicKey"] == KEYS[1].base64
