"""A fake kube-apiserver over real HTTP, for flock's tests and lab.

In a test, :class:`ApiServer` runs the server on a thread with its own asyncio
loop; every public method is thread-safe and may be called from Trio::

    with ApiServer() as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        api.create(PODS, pod_object)
        api.compact(expire_watches=True)

As a process (the lab)::

    python -m flock.apiserver --host 2001:db8::1 --port 6443 --kubeconfig-out /tmp/kc

(``--service-cluster-ip-range fd00:10:96::/112,192.0.2.192/27``: where Services' ClusterIPs
come from, the first family primary; the lab's: ``--netns NAME`` binds host:port inside that namespace, ``--also-listen
127.0.0.1:0`` serves the process's own namespace too, and the kubeconfig then points there)

It prints one JSON line ``{"url": …, "kubeconfig": …}`` once it serves (after
``--load``: JSON or JSON lines, e.g. a benchmark's 150,000 pods), and faults
can be injected over HTTP: ``POST /flock-testing/drop``,
``/flock-testing/fail?count=3&status=503``, ``/flock-testing/compact?expire=1``,
``/flock-testing/pause``, ``/flock-testing/resume``; ``GET /flock-testing/stats``
says what it holds (objects and bytes of JSON per resource).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import sys

from ._http import HttpFrontend
from ._server import load_objects, write_kubeconfig
from ._service_alloc import DEFAULT_SERVICE_CLUSTER_IP_RANGE
from ._store import DEFAULT_HISTORY, ObjectStore


async def _serve(args: argparse.Namespace) -> None:
    try:
        store = ObjectStore(history_limit=args.history, service_cluster_ip_range=args.service_cluster_ip_range)
    except ValueError as exc:
        raise SystemExit(f"--service-cluster-ip-range: {exc}") from None
    # This process owns the collector: none while loading (every decoded object is garbage at
    # once, and collections would scan the ones kept), then what was loaded is left out of
    # later collections (gc.freeze), which would otherwise walk every stored object.
    gc.disable()
    try:
        for path in args.load:
            load_objects(store, path)
    finally:
        gc.enable()
    gc.freeze()
    frontend = HttpFrontend(
        store,
        args.host,
        args.port,
        args.bookmark_interval,
        watch_list=not args.no_watch_list,
        paged_cache_lists=args.paged_cache_lists,
        netns=args.netns,
        also_listen=[_host_port(text) for text in args.also_listen],
    )
    await frontend.start()
    try:
        if args.kubeconfig_out:
            # Where this process is (a user's shell, say): the first --also-listen, else --host.
            write_kubeconfig(args.kubeconfig_out, (frontend.also_urls or [frontend.url])[0])
        print(
            json.dumps({"url": frontend.url, "also": frontend.also_urls, "kubeconfig": args.kubeconfig_out}), flush=True
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await frontend.stop()


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"--also-listen {text!r}: expected HOST:PORT (e.g. 127.0.0.1:0, [::1]:6443)")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flock.apiserver", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (IPv4 or IPv6)")
    parser.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    parser.add_argument("--netns", help="bind --host/--port inside this network namespace (a name under /run/netns)")
    parser.add_argument(
        "--also-listen",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="serve here too, in this process's own network namespace (port 0: any free port; repeatable)",
    )
    parser.add_argument(
        "--kubeconfig-out",
        help="write a kubeconfig pointing at this server here (at the first --also-listen address if given)",
    )
    parser.add_argument(
        "--load",
        action="append",
        default=[],
        help="JSON (a list or a List) or JSON-lines file of objects to create at start (repeatable)",
    )
    parser.add_argument("--bookmark-interval", type=float, default=5.0, help="seconds between BOOKMARK events")
    parser.add_argument(
        "--no-watch-list",
        action="store_true",
        help="refuse sendInitialEvents (422), as a server with the WatchList feature gate off",
    )
    parser.add_argument(
        "--paged-cache-lists",
        action="store_true",
        help='page lists at resourceVersion "0" too (1.33+); by default they are answered whole, as 1.32 does',
    )
    parser.add_argument(
        "--service-cluster-ip-range",
        default=DEFAULT_SERVICE_CLUSTER_IP_RANGE,
        metavar="CIDR[,CIDR]",
        help="where Services' ClusterIPs come from: one CIDR, or two of different families for dual-stack "
        f"(the first is the primary family; default {DEFAULT_SERVICE_CLUSTER_IP_RANGE})",
    )
    parser.add_argument(
        "--history", type=int, default=DEFAULT_HISTORY, help="changes kept (older versions are compacted)"
    )
    asyncio.run(_serve(parser.parse_args(argv)))
    return 0


__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
