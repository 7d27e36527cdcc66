"""Pod informer at scale: 500 pods on this node, 5,000 on others.

The fake API server runs as its own process (``python -m flock.apiserver
--load``) so this process's RSS is the agent side only.  Measures the cost of
importing the client stack, list+watch until ready, the RSS afterwards, the
time from POSTing one more pod to the cache holding it, and, as a baseline in the same run, the same list
decoded into kubernetes-asyncio's model objects instead of raw JSON.

    .venv/bin/python bench/watchers.py [--local 500] [--others 5000]

Prints its figures as a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def realistic_pod(namespace: str, name: str, node: str) -> dict:
    """A pod about the size of a real Deployment replica's (~3 KiB of JSON).

    Built here rather than with flock.testing.pod_object: importing flock.testing
    would load the client stack before its cost is measured.
    """
    pod: dict = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": {"app": name.rsplit("-", 1)[0], "pod-template-hash": "5d8f7c9b4"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x" * 1500},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "app-5d8f7c9b4",
                    "uid": "0" * 36,
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.example/app:1"}]},
    }
    pod["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "podIPs": [{"ip": "2001:db8::1"}],
    }
    return pod


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local", type=int, default=500)
    parser.add_argument("--others", type=int, default=5000)
    args = parser.parse_args()

    import attrs  # noqa: F401  (flock.model's dependency: the agent has it loaded already)
    import trio  # the agent imports trio anyway: not part of the client stack's cost

    node = "bench-node"
    tmp = Path(tempfile.mkdtemp(prefix="flock-bench-"))
    # Written one pod at a time, so this process never holds the 5,500 of them.
    with open(tmp / "pods.json", "w") as f:
        f.write("[")
        for i in range(args.local + args.others):
            on_node = i < args.local
            pod = realistic_pod(
                f"ns{i % 20}", f"{'local' if on_node else 'other'}-{i}", node if on_node else f"node{i % 50}"
            )
            f.write(("," if i else "") + json.dumps(pod))
        f.write("]")

    rss_before = rss_mib()
    t = time.perf_counter()
    from kubernetes_asyncio.client import CoreV1Api

    import flock.watchers as watchers

    import_seconds = time.perf_counter() - t
    import_rss = rss_mib() - rss_before
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flock.apiserver",
            "--port",
            "0",
            "--load",
            str(tmp / "pods.json"),
            "--kubeconfig-out",
            str(tmp / "kubeconfig"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = json.loads(server.stdout.readline())["url"]  # type: ignore[union-attr]
        result = trio.run(measure, watchers, CoreV1Api, tmp / "kubeconfig", node, url, args.local)
    finally:
        server.terminate()
        server.wait()
        server.stdout.close()  # type: ignore[union-attr]
    result.update(
        local_pods=args.local,
        other_pods=args.others,
        import_client_stack_seconds=round(import_seconds, 3),
        import_client_stack_rss_mib=round(import_rss, 1),
        peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        python=sys.version.split()[0],
    )
    print(json.dumps(result))


async def measure(watchers, CoreV1Api, kubeconfig: Path, node: str, url: str, local: int) -> dict:
    import trio

    rss_start = rss_mib()
    t0 = time.perf_counter()
    async with watchers.open_kube_client(kubeconfig) as kube:
        watcher = watchers.PodWatcher(kube.pods_on_node(node), node)
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            ready_seconds = time.perf_counter() - t0
            assert len(watcher.pods) == local, (len(watcher.pods), local)
            assert all(p.node_name == node for p in watcher.pods.values())
            rss_ready = rss_mib()

            # One more pod: time from the API's answer to the cache holding it.
            body = json.dumps(
                {
                    "metadata": {"name": "late", "namespace": "ns0"},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
                }
            ).encode()
            request = urllib.request.Request(
                f"{url}/api/v1/namespaces/ns0/pods", body, {"Content-Type": "application/json"}
            )
            t1 = time.perf_counter()
            async with trio.open_nursery() as inner:
                inner.start_soon(trio.to_thread.run_sync, lambda: urllib.request.urlopen(request).read())
                await watcher.wait_for_pod("ns0", "late")
                event_seconds = time.perf_counter() - t1

            # Baseline: the same list through the library's model objects.
            core = CoreV1Api(kube.api_client)
            t2 = time.perf_counter()
            listed = await kube.bridge.call(core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
            model_list_seconds = time.perf_counter() - t2
            assert len(listed.items) == local + 1
            t3 = time.perf_counter()
            items: list = []
            await kube.pods_on_node(node).list(watchers.ListOptions(), items.append)
            raw_list_seconds = time.perf_counter() - t3
            assert len(items) == local + 1
            nursery.cancel_scope.cancel()
    return {
        "ready_seconds": round(ready_seconds, 3),
        "rss_after_ready_mib": round(rss_ready, 1),
        "rss_growth_to_ready_mib": round(rss_ready - rss_start, 1),
        "create_to_cache_ms": round(event_seconds * 1000, 2),
        "list_raw_json_seconds": round(raw_list_seconds, 4),
        "baseline_list_models_seconds": round(model_list_seconds, 4),
    }


if __name__ == "__main__":
    main()
