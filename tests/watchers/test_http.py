"""The watchers against flock.testing's API server over real HTTP, with faults.

After every fault the informer's cache must end equal to the server's state:
the test compares them object for object.  Wall-clock only: these tests wait
on real sockets, so no autojump_clock here.
"""

from __future__ import annotations

import gc
import logging
import random
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import trio
from kubernetes_asyncio.client import Configuration

from flock.apiserver import NODECONFIGS, PODS, ApiServer, nodeconfig_object, pod_object
from flock.model import PodInfo
from flock.nursery import Backoff
from flock.testing import serving
from flock.watchers import (
    ClientConfigError,
    InformerSettings,
    NodeConfigWatcher,
    PodWatcher,
    in_cluster_configuration,
    open_kube_client,
)

NODE = "host001"
# Short enough that a stalled watch is noticed in 1.5 s of wall time.
FAST = InformerSettings(
    watch_seconds=1, request_seconds=0.5, relist_seconds=600, backoff=Backoff(initial=0.05, cap=0.4, jitter=0.2)
)


def server_state(api: ApiServer) -> dict[str, dict[str, Any]]:
    return {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in api.list(PODS, f"spec.nodeName={NODE}")}


def cached(watcher: PodWatcher) -> dict[str, PodInfo | None]:
    """What the informer keeps of each pod on the node (values, never the objects)."""
    return {k: record.local for k, record in watcher.informer.objects.items()}


def wanted(api: ApiServer) -> dict[str, PodInfo | None]:
    return {k: PodInfo.from_object(o) for k, o in server_state(api).items()}


async def converged(api: ApiServer, watcher: PodWatcher) -> None:
    """Until the watcher's cache equals the server's state (woken by each change, no polling)."""
    with watcher.subscribe() as changes:
        while cached(watcher) != wanted(api):
            await changes.receive()
    want = wanted(api)
    assert cached(watcher) == want
    assert dict(watcher.pods) == want


def pod_lists(api: ApiServer) -> int:
    """How many times the pods were read whole on this server: lists (their first pages)
    and WatchLists (watches with sendInitialEvents)."""
    reads = 0
    for method, path in api.requests:
        query = parse_qs(urlsplit(path).query)
        if method != "GET" or urlsplit(path).path != "/api/v1/pods":
            continue
        if "watch" in query:
            reads += query.get("sendInitialEvents", [""])[0].lower() == "true"
        else:
            reads += "continue" not in query
    return reads


class Churn:
    """Pods coming, changing and going, on this node and others."""

    def __init__(self, api: ApiServer, seed: int) -> None:
        self.api, self.rng, self.n = api, random.Random(seed), 0

    def step(self, count: int = 8) -> None:
        for _ in range(count):
            pods = self.api.list(PODS)
            roll = self.rng.random()
            if pods and roll < 0.3:
                victim = self.rng.choice(pods)["metadata"]
                self.api.delete(PODS, victim["name"], victim["namespace"])
            elif pods and roll < 0.6:
                pod = self.rng.choice(pods)
                pod["metadata"]["annotations"] = {"flock.fritzlab.net/ipv4": self.rng.choice(["true", "false"])}
                pod["spec"]["nodeName"] = self.rng.choice([NODE, NODE, "host002"])
                self.api.update(PODS, pod)
            else:
                self.n += 1
                ns = self.rng.choice(["web", "db"])
                self.api.create(PODS, pod_object(ns, f"p{self.n}", self.rng.choice([NODE, "host002", ""])))


async def fault_drop(api: ApiServer, churn: Churn) -> None:
    for _ in range(3):
        api.drop_connections()
        churn.step()
        await trio.sleep(0.1)


async def fault_5xx(api: ApiServer, churn: Churn) -> None:
    api.fail_next(5, 503)
    api.drop_connections()
    churn.step()


async def fault_restart(api: ApiServer, churn: Churn) -> None:
    api.stop()
    churn.step()
    await trio.sleep(0.3)  # reconnects are refused meanwhile
    api.start()


async def fault_pause(api: ApiServer, churn: Churn) -> None:
    api.pause()
    churn.step()
    await trio.sleep(2.0)  # longer than watch_seconds + request_seconds: the client gives up and retries
    api.resume()


async def fault_expire_mid_stream(api: ApiServer, churn: Churn) -> None:
    churn.step()
    api.compact(expire_watches=True)
    churn.step()


async def fault_expired_at_start(api: ApiServer, churn: Churn) -> None:
    api.stop()
    churn.step()
    api.compact()  # the watch's resourceVersion is gone when it comes back
    api.start()


@pytest.mark.parametrize(
    ("fault", "relists"),
    [
        (fault_drop, 0),
        (fault_5xx, 0),
        (fault_restart, 0),
        (fault_pause, 0),
        (fault_expire_mid_stream, 1),
        (fault_expired_at_start, 1),
    ],
)
async def test_cache_ends_equal_to_server_after_fault(tmp_path: Path, fault: Any, relists: int) -> None:
    with trio.fail_after(30), ApiServer(bookmark_interval=0.2) as api:
        churn = Churn(api, seed=len(fault.__name__))
        churn.step(20)
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc")) as kube:
            watcher = PodWatcher(kube.pods_on_node(NODE), NODE, FAST)
            async with serving(watcher):
                await converged(api, watcher)
                churn.step()
                await fault(api, churn)
                churn.step()
                await converged(api, watcher)
                # Transient faults resume the watch from the last version; only 410 relists.
                assert pod_lists(api) == 1 + relists


async def test_bookmarks_carry_the_version_past_changes_the_watch_does_not_see(tmp_path: Path) -> None:
    with trio.fail_after(20), ApiServer(bookmark_interval=0.1) as api:
        api.create(PODS, pod_object("web", "web-0", NODE))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc")) as kube:
            watcher = PodWatcher(kube.pods_on_node(NODE), NODE, InformerSettings(watch_seconds=30))
            async with serving(watcher):
                for i in range(5):
                    api.create(PODS, pod_object("web", f"other-{i}", "host002"))
                # Only a BOOKMARK can tell the informer about versions on other nodes.
                await watcher.informer.wait_synced(str(api.store.resource_version))
                # So after compaction and a cut connection it resumes without a 410 relist.
                api.compact()
                api.drop_connections()
                api.create(PODS, pod_object("web", "web-1", NODE))
                await converged(api, watcher)
                assert pod_lists(api) == 1


async def test_lookup_over_http_waits_for_the_watch_then_gets_directly(tmp_path: Path) -> None:
    with trio.fail_after(20), ApiServer() as api:
        api.create(PODS, pod_object("web", "elsewhere", "host002"))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc")) as kube:
            watcher = PodWatcher(kube.pods_on_node(NODE), NODE, FAST, cache_wait_seconds=0.5)
            async with serving(watcher) as nursery:

                async def scheduler() -> None:
                    await trio.sleep(0.2)
                    api.create(PODS, pod_object("web", "web-0", NODE))

                nursery.start_soon(scheduler)
                pod = await watcher.lookup("web", "web-0")
                assert pod is not None and pod.node_name == NODE
                assert await watcher.lookup("web", "missing") is None
                pod = await watcher.lookup("web", "elsewhere")
                assert pod is not None and pod.node_name == "host002"
                gets = [path for method, path in api.requests if "/namespaces/web/pods/" in path]
                assert gets == ["/api/v1/namespaces/web/pods/missing", "/api/v1/namespaces/web/pods/elsewhere"]


async def test_nodeconfig_watcher_over_http(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(20), ApiServer() as api:
        api.create(NODECONFIGS, nodeconfig_object("host002", "2001:db8:0:2::/64"))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc")) as kube:
            watcher = NodeConfigWatcher(kube.nodeconfig(NODE), NODE, FAST)
            async with serving(watcher):
                assert watcher.current is None and dict(watcher.informer.objects) == {}
                api.create(NODECONFIGS, nodeconfig_object(NODE, bgp={"asn": 64512, "routerID": "192.0.2.11"}))
                first = await watcher.wait_changed()
                assert str(first.cidr6) == "2001:db8:0:1::/64" and first.bgp is not None

                bad = api.get(NODECONFIGS, NODE)
                bad["spec"]["bgp"]["asn"] = 0
                refused = api.update(NODECONFIGS, bad)
                await watcher.informer.wait_synced(refused["metadata"]["resourceVersion"])
                assert watcher.invalid is not None
                assert watcher.invalid.field == "spec.bgp.asn" and watcher.current == first

                api.drop_connections()
                fixed = api.get(NODECONFIGS, NODE)
                fixed["spec"]["bgp"]["asn"] = 64513
                api.update(NODECONFIGS, fixed)
                second = await watcher.wait_changed(first)
                assert second.bgp is not None and second.bgp.asn == 64513
                assert dict(watcher.informer.objects) == {NODE: api.get(NODECONFIGS, NODE)}


async def test_cancellation_leaves_no_session_or_connection(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(20), ApiServer() as api:
        api.create(PODS, pod_object("web", "web-0", NODE))
        kubeconfig = api.write_kubeconfig(tmp_path / "kc")
        with caplog.at_level(logging.DEBUG, logger="asyncio"):
            # Cancelled mid-watch.
            async with open_kube_client(kubeconfig) as kube:
                watcher = PodWatcher(kube.pods_on_node(NODE), NODE, FAST)
                async with serving(watcher):
                    await trio.sleep(0.2)
                    assert api.open_requests == 1  # the watch
            # Cancelled while the first list hangs on a paused server, and the
            # whole client (bridge included) torn down by the same cancellation.
            api.pause()
            with trio.move_on_after(0.3) as scope:
                async with open_kube_client(kubeconfig) as kube:
                    await PodWatcher(kube.pods_on_node(NODE), NODE, FAST).run()
            assert scope.cancelled_caught
            api.resume()
            # Counted on the server's own thread: nothing in Trio to wait on.
            while api.open_requests:  # noqa: ASYNC110
                await trio.sleep(0.01)
            gc.collect()
        assert [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.WARNING] == []


def test_in_cluster_configuration_strips_token_and_leaves_global_default(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret-token\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    before = Configuration.get_default_copy().host
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    conf = in_cluster_configuration(env, tmp_path)
    assert conf.host == "https://[fd00::1]:443"
    assert conf.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert conf.api_key["BearerToken"] == "Bearer s3cret-token"
    assert Configuration.get_default_copy().host == before

    rotating = in_cluster_configuration(env, tmp_path, token_reread_seconds=0)
    (tmp_path / "token").write_text("rotated\n")
    rotating.refresh_api_key_hook(rotating)
    assert rotating.api_key["BearerToken"] == "Bearer rotated"
    (tmp_path / "token").unlink()
    rotating.refresh_api_key_hook(rotating)  # a failed re-read keeps the token it has
    assert rotating.api_key["BearerToken"] == "Bearer rotated"
    (tmp_path / "token").write_text("s3cret-token\n")

    with pytest.raises(ClientConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster_configuration({}, tmp_path)
    (tmp_path / "token").write_text("\n")
    with pytest.raises(ClientConfigError, match="empty"):
        in_cluster_configuration(env, tmp_path)


async def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with trio.fail_after(10):
        with pytest.raises(ClientConfigError, match="does not exist"):
            async with open_kube_client(tmp_path / "nope"):
                pass


async def test_ipv6_server(tmp_path: Path) -> None:
    with trio.fail_after(20), ApiServer(host="::1") as api:
        assert api.url.startswith("http://[::1]:")
        api.create(PODS, pod_object("web", "web-0", NODE))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc")) as kube:
            watcher = PodWatcher(kube.pods_on_node(NODE), NODE, FAST)
            async with serving(watcher):
                assert list(watcher.pods) == ["web/web-0"]


async def test_api_server_restarted_empty_is_relisted_and_the_lost_nodeconfig_noticed(tmp_path: Path) -> None:
    with trio.fail_after(30), ApiServer(bookmark_interval=0.2) as api:
        api.create(NODECONFIGS, nodeconfig_object(NODE))
        for i in range(5):
            api.create(PODS, pod_object("web", f"web-{i}", NODE))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc")) as kube:
            watcher = NodeConfigWatcher(kube.nodeconfig(NODE), NODE, FAST)
            async with serving(watcher):
                await watcher.wait_changed()
                api.restart(empty=True)  # etcd wiped: resourceVersions start over
                await watcher.wait_deleted(True)
                api.create(NODECONFIGS, nodeconfig_object(NODE))
                await watcher.wait_deleted(False)
