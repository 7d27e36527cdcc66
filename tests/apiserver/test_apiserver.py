"""flock.testing's API server, exercised with the real kubernetes-asyncio client over HTTP.

Each scenario is an asyncio coroutine run through flock.watchers' bridge: the
client stack is used exactly as the agent uses it.
"""

from __future__ import annotations

import base64
import http.client
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from flock.apiserver import PODS, SECRETS, ApiServer, nodeconfig_object, pod_object, secret_object
from flock.watchers import KubeClient, ListOptions, open_kube_client


async def run_scenario(api: ApiServer, tmp_path: Path, scenario: Any) -> Any:
    """Run asyncio coroutine function scenario(kube) against *api* with the agent's client."""
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
        return await kube.bridge.call(scenario, kube)


def status_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


async def test_crud_and_status_objects(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> None:
        core = CoreV1Api(kube.api_client)
        created = await core.create_namespaced_pod("web", pod_object("web", "web-0", "host001"))
        assert created.metadata.namespace == "web" and created.metadata.uid
        rv = int(created.metadata.resource_version)

        got = await core.read_namespaced_pod("web-0", "web")
        assert got.spec.node_name == "host001" and got.spec.containers[0].image

        with pytest.raises(ApiException) as exc:
            await core.create_namespaced_pod("web", pod_object("web", "web-0", "host001"))
        assert exc.value.status == 409 and status_of(exc.value)["reason"] == "AlreadyExists"

        body = pod_object("web", "web-0", "host001", annotations={"a": "b"})
        body["metadata"]["resourceVersion"] = str(rv)
        updated = await core.replace_namespaced_pod("web-0", "web", body)
        assert int(updated.metadata.resource_version) > rv
        assert updated.metadata.uid == created.metadata.uid
        with pytest.raises(ApiException) as exc:  # stale resourceVersion
            await core.replace_namespaced_pod("web-0", "web", body)
        assert exc.value.status == 409 and status_of(exc.value)["reason"] == "Conflict"

        no_containers = pod_object("web", "bad", "host001")
        no_containers["spec"]["containers"] = []
        with pytest.raises(ApiException) as exc:
            await core.create_namespaced_pod("web", no_containers)
        status = status_of(exc.value)
        assert exc.value.status == 422 and status["kind"] == "Status" and status["reason"] == "Invalid"
        assert status["details"]["causes"][0]["field"] == "spec.containers"

        patched = await core.patch_namespaced_pod(
            "web-0", "web", {"metadata": {"annotations": {"a": None, "flock.fritzlab.net/ipv4": "true"}}}
        )
        assert patched.metadata.annotations == {"flock.fritzlab.net/ipv4": "true"}
        assert patched.spec.containers[0].name == "app"  # untouched by the patch
        # A JSON patch (RFC 6902) too, as kubectl sends with --type=json.
        patched = await core.patch_namespaced_pod("web-0", "web", [{"op": "remove", "path": "/metadata/labels"}])
        assert not patched.metadata.labels
        with pytest.raises(ApiException) as exc:
            await core.patch_namespaced_pod("web-0", "web", [{"op": "remove", "path": "/metadata/labels"}])
        assert exc.value.status == 422

        # A bound pod is deleted gracefully: marked terminating with its grace (30 s by default),
        # still there until the kubelet's DELETE with gracePeriodSeconds=0 removes it.
        marked = await core.delete_namespaced_pod("web-0", "web")
        assert marked.metadata.deletion_timestamp and marked.metadata.deletion_grace_period_seconds == 30
        assert (await core.read_namespaced_pod("web-0", "web")).metadata.deletion_grace_period_seconds == 30
        await core.delete_namespaced_pod("web-0", "web", grace_period_seconds=0)
        with pytest.raises(ApiException) as exc:
            await core.read_namespaced_pod("web-0", "web")
        assert exc.value.status == 404 and status_of(exc.value)["reason"] == "NotFound"

        custom = CustomObjectsApi(kube.api_client)
        group, version, plural = "flock.fritzlab.net", "v1alpha1", "nodeconfigs"
        await custom.create_cluster_custom_object(group, version, plural, nodeconfig_object("host001"))
        nc = await custom.get_cluster_custom_object(group, version, plural, "host001")
        assert nc["spec"]["cidr6"] == "2001:db8:0:1::/64" and "namespace" not in nc["metadata"]
        await custom.delete_cluster_custom_object(group, version, plural, "host001")
        with pytest.raises(ApiException) as exc:
            await custom.get_cluster_custom_object(group, version, plural, "host001")
        assert exc.value.status == 404

    with trio.fail_after(20), ApiServer() as api:
        await run_scenario(api, tmp_path, scenario)


async def test_list_field_selectors_and_monotonic_versions(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> None:
        core = CoreV1Api(kube.api_client)
        versions = []
        for ns, name, node in [("a", "p1", "n1"), ("b", "p2", "n1"), ("a", "p3", "n2")]:
            pod = await core.create_namespaced_pod(ns, pod_object(ns, name, node))
            versions.append(int(pod.metadata.resource_version))
        assert versions == sorted(versions) and len(set(versions)) == 3

        on_n1 = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
        assert sorted(p.metadata.name for p in on_n1.items) == ["p1", "p2"]
        assert int(on_n1.metadata.resource_version) == versions[-1]
        not_n1 = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=n1")
        assert [p.metadata.name for p in not_n1.items] == ["p3"]
        both = await core.list_pod_for_all_namespaces(field_selector="metadata.namespace=a,metadata.name==p3")
        assert [p.metadata.name for p in both.items] == ["p3"]
        in_a = await core.list_namespaced_pod("a")
        assert sorted(p.metadata.name for p in in_a.items) == ["p1", "p3"]

        with pytest.raises(ApiException) as exc:
            await core.list_pod_for_all_namespaces(field_selector="spec.bogus=x")
        assert exc.value.status == 400 and "field label not supported" in status_of(exc.value)["message"]

    with trio.fail_after(20), ApiServer() as api:
        await run_scenario(api, tmp_path, scenario)


async def test_watch_replays_from_version_filters_and_ends_at_timeout(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> list[tuple[str, str]]:
        core = CoreV1Api(kube.api_client)
        first = await core.create_namespaced_pod("a", pod_object("a", "p1", "n1"))
        await core.create_namespaced_pod("a", pod_object("a", "p2", "n2"))
        unbound = await core.create_namespaced_pod("a", pod_object("a", "p3"))
        body = pod_object("a", "p3", "n1")
        await core.replace_namespaced_pod("p3", "a", body)  # bound to n1: ADDED for an n1 watch
        await core.delete_namespaced_pod("p1", "a", grace_period_seconds=0)
        seen = []
        # The library's own Watch sends watch=True (a Python bool in the query).
        watch = Watch()
        try:
            async for event in watch.stream(
                core.list_pod_for_all_namespaces,
                field_selector="spec.nodeName=n1",
                resource_version=str(int(first.metadata.resource_version) - 1),
                timeout_seconds=1,
            ):
                seen.append((event["type"], event["object"].metadata.name))
        finally:
            await watch.close()
        assert unbound.spec.node_name is None
        return seen

    with trio.fail_after(20), ApiServer() as api:
        seen = await run_scenario(api, tmp_path, scenario)
    assert seen == [("ADDED", "p1"), ("ADDED", "p3"), ("DELETED", "p1")]


async def raw_watch(kube: KubeClient, **query: Any) -> tuple[int, list[dict[str, Any]]]:
    """(asyncio) One watch's status and events, read to the end."""
    core = CoreV1Api(kube.api_client)
    resp = await core.list_pod_for_all_namespaces(watch=True, _preload_content=False, **query)
    try:
        if resp.status != 200:
            return resp.status, [json.loads(await resp.read())]
        return resp.status, [json.loads(line) async for line in resp.content if line.strip()]
    finally:
        resp.release()


async def test_watch_too_old_is_an_error_event_then_bookmarks_and_410_mid_stream(tmp_path: Path) -> None:
    with trio.fail_after(20), ApiServer(bookmark_interval=0.2) as api:
        api.create(PODS, pod_object("a", "p1", "n1"))
        old = api.create(PODS, pod_object("a", "p2", "n1"))["metadata"]["resourceVersion"]
        api.create(PODS, pod_object("a", "p3", "n1"))
        compacted = api.compact()

        async def scenario(kube: KubeClient) -> None:
            # As the watch cache: a version too old is an ERROR event, the stream already open.
            status, (event,) = await raw_watch(kube, resource_version=old)
            assert status == 200 and event["type"] == "ERROR"
            body = event["object"]
            assert (body["kind"], body["code"], body["reason"]) == ("Status", 410, "Expired")
            assert body["message"] == f"too old resource version: {old} ({compacted})"

            status, events = await raw_watch(
                kube, resource_version=str(compacted), allow_watch_bookmarks="true", timeout_seconds=1
            )
            assert status == 200 and events and {e["type"] for e in events} == {"BOOKMARK"}
            assert events[-1]["object"]["metadata"]["resourceVersion"] == str(compacted)

        await run_scenario(api, tmp_path, scenario)

        async def expire_soon() -> None:
            # Once the watch is open on the server (no guessing with a sleep).
            while not await trio.to_thread.run_sync(lambda: api.open_requests):  # noqa: ASYNC110  server thread's count
                await trio.sleep(0.01)
            await trio.to_thread.run_sync(lambda: api.compact(expire_watches=True))

        async def mid_stream(kube: KubeClient) -> tuple[int, list[dict[str, Any]]]:
            return await raw_watch(kube, resource_version=str(compacted), timeout_seconds=10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(expire_soon)
            status, events = await run_scenario(api, tmp_path, mid_stream)
        assert status == 200 and [e["type"] for e in events] == ["ERROR"]
        assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (410, "Expired")


async def wait_until_idle(api: ApiServer) -> None:
    """Until the server has no request open (a test helper: the server runs on its own thread)."""
    while await trio.to_thread.run_sync(lambda: api.open_requests):  # noqa: ASYNC110  server thread's count
        await trio.sleep(0.01)


async def test_injected_5xx_and_pause(tmp_path: Path) -> None:
    with trio.fail_after(20), ApiServer() as api:
        api.fail_next(2, 503)
        api.pause()
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
            core = CoreV1Api(kube.api_client)

            async def held() -> None:
                with pytest.raises(TimeoutError):  # held while paused
                    await core.list_namespaced_pod("a", _request_timeout=0.3)

            await kube.bridge.call(held)
            await wait_until_idle(api)  # the client hung up: the server's request ended too
            api.resume()

            async def after_resume() -> None:
                for _ in range(2):
                    with pytest.raises(ApiException) as exc:
                        await core.list_namespaced_pod("a")
                    assert exc.value.status == 503
                assert (await core.list_namespaced_pod("a")).items == []

            await kube.bridge.call(after_resume)


async def test_standalone_process_on_ipv6_loopback(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    (tmp_path / "objects.json").write_text(json.dumps([pod_object("a", "p0", "n1"), nodeconfig_object("n1")]))
    argv = [
        sys.executable,
        "-m",
        "flock.apiserver",
        "--host",
        "::1",
        "--port",
        "0",
        "--kubeconfig-out",
        str(kubeconfig),
        "--load",
        str(tmp_path / "objects.json"),
    ]
    # A plain Popen (its stdout read line by line on a thread), started off the Trio thread.
    proc = await trio.to_thread.run_sync(
        lambda: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    )
    try:
        with trio.fail_after(20):
            line = await trio.to_thread.run_sync(proc.stdout.readline)  # type: ignore[union-attr]
            info = json.loads(line)
            assert info["url"].startswith("http://[::1]:") and Path(info["kubeconfig"]) == kubeconfig

            async with open_kube_client(kubeconfig) as kube:

                async def scenario() -> list[str]:
                    core = CoreV1Api(kube.api_client)
                    await core.create_namespaced_pod("a", pod_object("a", "p1", "n1"))
                    return [p.metadata.name for p in (await core.list_namespaced_pod("a")).items]

                assert await kube.bridge.call(scenario) == ["p0", "p1"]
            proc.send_signal(signal.SIGTERM)
            assert await trio.to_thread.run_sync(proc.wait) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        err = proc.stderr.read()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    assert "Traceback" not in err, err
    assert await trio.Path(kubeconfig).exists()


def call(api: ApiServer, method: str, path: str) -> tuple[int, Any]:
    """Plain urllib, for what the lab does with curl."""
    request = urllib.request.Request(api.url + path, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def test_watch_flag_spellings_and_bad_parameters() -> None:
    with ApiServer() as api:
        api.create(PODS, pod_object("a", "p1", "n1"))
        for flag in ("true", "True", "1"):
            status, events = call(api, "GET", f"/api/v1/pods?watch={flag}&timeoutSeconds=0.1")
            assert status == 200 and [e["type"] for e in events] == ["ADDED"]
        status, (listed,) = call(api, "GET", "/api/v1/pods?watch=false")
        assert status == 200 and listed["kind"] == "PodList"
        status, body = call(api, "GET", "/api/v1/pods?watch=1&timeoutSeconds=soon")
        assert (status, body["reason"]) == (400, "BadRequest") and "timeoutSeconds" in body["message"]
        status, body = call(api, "GET", "/api/v1/pods?watch=1&resourceVersion=abc")
        assert (status, body["reason"]) == (400, "BadRequest")


def test_fault_endpoints_for_the_lab() -> None:
    with ApiServer() as api:
        assert call(api, "POST", "/flock-testing/fail?count=1&status=503")[0] == 200
        status, body = call(api, "GET", "/api/v1/pods")
        assert (status, body["code"], body["kind"]) == (503, 503, "Status")
        assert call(api, "GET", "/api/v1/pods")[0] == 200
        api.create(PODS, pod_object("a", "p1", "n1"))
        status, (body,) = call(api, "POST", "/flock-testing/compact")
        assert body == {"resourceVersion": str(api.store.resource_version)}
        status, (event,) = call(api, "GET", "/api/v1/pods?watch=1&resourceVersion=1")
        assert (status, event["type"], event["object"]["code"]) == (200, "ERROR", 410)
        assert call(api, "POST", "/flock-testing/pause")[0] == 200
        with pytest.raises(TimeoutError):
            urllib.request.urlopen(api.url + "/api/v1/pods", timeout=0.3)
        assert call(api, "POST", "/flock-testing/resume")[0] == 200
        assert call(api, "GET", "/api/v1/pods")[0] == 200
        with urllib.request.urlopen(api.url + "/api/v1/pods?watch=1&resourceVersion=0", timeout=5) as watch:
            assert json.loads(watch.readline())["type"] == "ADDED"
            assert call(api, "POST", "/flock-testing/drop")[1] == [{"dropped": 1}]
            with pytest.raises(http.client.IncompleteRead):  # cut, not ended
                watch.read()
        status, body = call(api, "POST", "/flock-testing/explode")
        assert status == 404 and "unknown fault" in body["message"]


async def test_secrets_are_served_like_kube_apiserver_does(tmp_path: Path) -> None:
    """v1 Secrets: stringData folded into base64 data, read by name, listed and
    watched with a metadata.name field selector; a bad value is refused without echoing it."""

    async def scenario(kube: KubeClient) -> None:
        core = CoreV1Api(kube.api_client)
        await core.create_namespaced_secret("kube-system", secret_object("kube-system", "bgp", {"tor1": "s3cret"}))
        await core.create_namespaced_secret("kube-system", secret_object("kube-system", "other", {"k": "v"}))
        got = await core.read_namespaced_secret("bgp", "kube-system")
        assert got.data == {"tor1": base64.b64encode(b"s3cret").decode()} and got.type == "Opaque"
        listed = await core.list_namespaced_secret("kube-system", field_selector="metadata.name=bgp")
        assert [s.metadata.name for s in listed.items] == ["bgp"]
        with pytest.raises(ApiException) as exc:
            await core.create_namespaced_secret(
                "kube-system",
                {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad"}, "data": {"k": "not base64!"}},
            )
        assert exc.value.status == 422 and "not base64!" not in exc.value.body

    with ApiServer() as api:
        await run_scenario(api, tmp_path, scenario)
        # A watch by name sees only that Secret's changes.
        events = []
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
            src = kube.secret("kube-system", "bgp")  # the agent's own source, over HTTP
            items: list[dict[str, Any]] = []
            rv = (await src.list(ListOptions(), items.append)).resource_version
            assert [i["metadata"]["name"] for i in items] == ["bgp"]
            api.patch(SECRETS, "other", {"stringData": {"k": "w"}}, "kube-system")
            api.patch(SECRETS, "bgp", {"stringData": {"tor1": "rotated"}}, "kube-system")
            with trio.fail_after(10):
                async with src.watch(rv, 5) as stream:
                    async for event in stream:
                        events.append(event)
                        break
    assert events[0]["type"] == "MODIFIED" and events[0]["object"]["metadata"]["name"] == "bgp"
    assert base64.b64decode(events[0]["object"]["data"]["tor1"]) == b"rotated"
