"""The fake API server holding a large cluster's pods: its memory and how fast it serves.

So that a scale benchmark measures the agent and not the fake: loads N
realistic pods (flock.testing.scale's generator: 4.2–6.0 KiB of JSON each,
managedFields, env, probes, volumes) into ``python -m flock.apiserver
--load`` (its own process) and reports its load time, the bytes of JSON it
holds, its RSS, and the time (to the last byte, read by a plain client) of a
whole unpaged list (``resourceVersion=0``, the watch cache), a paged list of
500s (``limit=500`` + ``continue``, etcd's consistent pages), a WatchList's
initial stream up to its annotated bookmark, and one node's pods (the
``spec.nodeName`` index).

    .venv/bin/python bench/fake_apiserver.py [--pods 150000] [--page 500] [--cache DIR]

The generated pods are kept in ``--cache`` (JSON lines) and reused by later
runs.  Prints its figures as a final JSON line.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


def shape_for(pods: int) -> Any:
    from flock.testing.scale import ClusterShape

    return ClusterShape(pods=pods, nodes=max(1, pods // 30), namespaces=max(1, pods // 75), policies=0)


def _write_part(pods: int, path: str, part: int, parts: int) -> int:
    from flock.testing.scale import ScaleCluster

    cluster = ScaleCluster(shape_for(pods))
    count = 0
    with open(path + ".tmp", "w") as f:
        for i in range(part, pods, parts):
            f.write(json.dumps(cluster.pod(i), separators=(",", ":")) + "\n")
            count += 1
    os.replace(path + ".tmp", path)
    return count


def pod_files(pods: int, cache: Path) -> list[Path]:
    """JSON-lines files of the pods, made in parallel once and reused."""
    parts = max(1, min(os.cpu_count() or 1, 8))
    paths = [cache / f"fake-apiserver-{pods}-pods-{p}-of-{parts}.jsonl" for p in range(parts)]
    missing = [p for p, path in enumerate(paths) if not path.exists()]
    if missing:
        print(f"generating {pods} pods into {cache} ({len(missing)} parts)…", file=sys.stderr, flush=True)
        with concurrent.futures.ProcessPoolExecutor(len(missing)) as pool:
            list(pool.map(_write_part, *zip(*[(pods, str(paths[p]), p, parts) for p in missing], strict=True)))
    return paths


def rss_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of process *pid*, MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


class Client:
    """A plain HTTP/1.1 client (keep-alive): reads bodies in big chunks, decodes nothing it need not."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection(HOST, port, timeout=600)

    def get(self, path: str, **query: str) -> tuple[bytes, int, float]:
        """(the body's first 64 KiB, its size, seconds to its last byte); the rest is read and dropped."""
        start = time.perf_counter()
        self.conn.request("GET", path + ("?" + urllib.parse.urlencode(query) if query else ""))
        reply = self.conn.getresponse()
        head = reply.read(1 << 16)
        if reply.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {reply.status}: {head[:300]!r}")
        size = len(head)
        while chunk := reply.read(1 << 20):
            size += len(chunk)
        return head, size, time.perf_counter() - start

    def watch_list(self, path: str) -> tuple[int, float, float]:
        """A WatchList up to its annotated bookmark: (events, seconds, MiB)."""
        query = "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        conn = http.client.HTTPConnection(HOST, self.conn.port, timeout=600)
        try:
            start = time.perf_counter()
            conn.request("GET", f"{path}?{query}&timeoutSeconds=600")
            reply = conn.getresponse()
            events = size = 0
            tail = b""
            while chunk := reply.read1(1 << 20):
                size += len(chunk)
                events += chunk.count(b"\n")
                if b'"k8s.io/initial-events-end":"true"' in tail[-200:] + chunk:
                    break
                tail = chunk
            return events, time.perf_counter() - start, size / 2**20
        finally:
            conn.close()


def measure(port: int, pid: int, page: int, nodes: int) -> dict[str, Any]:
    client = Client(port)
    out: dict[str, Any] = {}
    _, size, seconds = client.get("/api/v1/pods", resourceVersion="0")
    out["unpaged_list_rv0"] = {"s": round(seconds, 3), "mib": round(size / 2**20, 1)}
    _, size, seconds = client.get("/api/v1/pods")
    out["unpaged_list_consistent"] = {"s": round(seconds, 3), "mib": round(size / 2**20, 1)}
    pages: list[float] = []
    token, total = "", time.perf_counter()
    while True:
        query = {"limit": str(page)} | ({"continue": token} if token else {})
        head, _, seconds = client.get("/api/v1/pods", **query)
        pages.append(seconds)
        meta = json.loads(head[: head.index(b',"items":[')] + b"}")["metadata"]
        token = meta.get("continue", "")
        if not token:
            break
    pages.sort()
    out["paged_list"] = {
        "limit": page,
        "pages": len(pages),
        "total_s": round(time.perf_counter() - total, 3),
        "page_ms_median": round(pages[len(pages) // 2] * 1000, 1),
        "page_ms_p99": round(pages[int(len(pages) * 0.99)] * 1000, 1),
    }
    events, seconds, mib = client.watch_list("/api/v1/pods")
    out["watch_list_initial"] = {"events": events, "s": round(seconds, 3), "mib": round(mib, 1)}
    node = f"node-{nodes // 2:05d}"
    *_, seconds = client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}", resourceVersion="0")
    *_, paged = client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}", limit=str(page))
    out["one_node_list_ms"] = {"rv0": round(seconds * 1000, 1), "paged": round(paged * 1000, 1)}
    out["rss_after_serving_mib"] = rss_mib(pid)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--page", type=int, default=500, help="limit of each page of the paged list")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()), help="where the pods' files go")
    args = parser.parse_args()
    files = pod_files(args.pods, args.cache)
    with tempfile.TemporaryDirectory() as work:
        out_path = Path(work) / "out"
        argv = [sys.executable, "-m", "flock.apiserver", "--host", HOST, "--port", "0"]
        for f in files:
            argv += ["--load", str(f)]
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out)
        try:
            start = time.perf_counter()
            while not out_path.read_bytes().endswith(b"\n"):
                if proc.poll() is not None:
                    raise SystemExit(f"the API server exited ({proc.returncode})")
                time.sleep(0.1)
            load_s = time.perf_counter() - start
            port = int(json.loads(out_path.read_text())["url"].rsplit(":", 1)[1])
            stats = json.loads(Client(port).get("/flock-testing/stats")[0])["resources"]["pods"]
            result: dict[str, Any] = {
                "pods": stats["objects"],
                "load_s": round(load_s, 1),
                "json_mib": round(stats["bytes"] / 2**20, 1),
                "bytes_per_pod": round(stats["bytes"] / stats["objects"]),
                "rss_after_load_mib": rss_mib(proc.pid),
            }
            result |= measure(port, proc.pid, args.page, shape_for(args.pods).nodes)
        finally:
            proc.terminate()
            proc.wait()
    for key, value in result.items():
        print(f"{key:>24}: {value}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
