"""``flock-controller [--kubeconfig PATH | --api-url URL] [--health-port PORT]``: flock-controller (see the package).

In a cluster it runs with its service account (no flag); ``--kubeconfig`` as the agent's; ``--api-url``
speaks plain HTTP without credentials (the lab's API server)."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from flock import logs
from flock.watchers import ClientConfigError, open_kube_client

from ._api import HttpApi, KubeApi, ObjectApi
from ._groups import GroupController
from ._health import serve_health
from ._lease import Elector, LeaseSettings
from ._loop import LoadBalancerController
from ._metrics import Progress
from ._watch import WatchingController

log = logging.getLogger("flock.controller")


@attrs.frozen
class Options:
    url: str | None  # plain HTTP, no credentials (the lab's, tests')
    kubeconfig: str | None  # None with no url: the pod's service account
    identity: str
    lease: LeaseSettings
    resync_seconds: float  # with url: a pass this often
    health_port: int | None  # /healthz, /readyz, /metrics on every family; None: none
    address_groups: bool = True  # with a kube client: the address groups agents' NetworkPolicy reads (issue 35)
    load_balancers: bool = True  # LoadBalancer addresses from LoadBalancerPools (off: MetalLB's controller gives them)


async def _lead(
    api: ObjectApi,
    elector: Elector,
    controller: Progress,
    run: Callable[[], Awaitable[None]],
    options: Options,
    groups: GroupController | None = None,
) -> None:
    async with trio.open_nursery() as nursery:
        if options.health_port is not None:
            await nursery.start(
                functools.partial(serve_health, groups=groups), options.health_port, elector, controller
            )
        log.info(
            "standing for election",
            extra={"identity": options.identity, "lease": f"{options.lease.namespace}/{options.lease.name}"},
        )
        await elector.run(run)


async def _main(options: Options) -> None:
    if options.url is not None:  # plain HTTP (the lab's, tests'): a pass every resync
        api: ObjectApi = HttpApi(options.url)
        elector = Elector(api, options.identity, options.lease)
        polling = LoadBalancerController(
            api, elector.confirm, resync_seconds=options.resync_seconds, identity=options.identity
        )
        await _lead(api, elector, polling, polling.run, options)
        return
    async with open_kube_client(options.kubeconfig) as client:  # a cluster's: a pass per change, by watches
        api = KubeApi(client)
        elector = Elector(api, options.identity, options.lease)
        watching = WatchingController(api, client, elector.confirm, identity=options.identity)
        groups = GroupController(api, client, elector.confirm) if options.address_groups else None
        loops = [loop.run for loop in (watching if options.load_balancers else None, groups) if loop is not None]

        async def work() -> None:
            """The loops while leading; one returning (fenced off) ends them all."""
            async with trio.open_nursery() as nursery:

                async def one(run: Callable[[], Awaitable[None]]) -> None:
                    await run()
                    nursery.cancel_scope.cancel()

                for run in loops:
                    nursery.start_soon(one, run)

        await _lead(api, elector, watching, work, options, groups)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="flock-controller", description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--kubeconfig", default=None, help="a kubeconfig (default: the pod's service account, in a cluster)"
    )
    where.add_argument("--api-url", default=None, help="an API server over plain HTTP, no credentials (the lab's)")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}")
    p.add_argument("--lease-namespace", default="kube-system")
    p.add_argument("--lease-name", default="flock-controller")
    p.add_argument(
        "--resync-seconds", type=float, default=1.0, help="with --api-url: a pass this often (watches otherwise)"
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="serve /healthz, /readyz and /metrics on this port, every address family (default: none)",
    )
    p.add_argument(
        "--no-address-groups",
        action="store_true",
        help="do not write address groups (agents run with --policy-peers=pods: each watches every Pod)",
    )
    p.add_argument(
        "--no-load-balancer-addresses",
        action="store_true",
        help="give Services of type LoadBalancer no address (another controller does: MetalLB's); "
        "the address groups are still written",
    )
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    args = p.parse_args(argv)
    logs.configure(fmt=args.log_format)
    options = Options(
        url=args.api_url,
        kubeconfig=args.kubeconfig,
        identity=args.identity,
        lease=LeaseSettings(namespace=args.lease_namespace, name=args.lease_name),
        resync_seconds=args.resync_seconds,
        health_port=args.health_port,
        address_groups=not args.no_address_groups,
        load_balancers=not args.no_load_balancer_addresses,
    )
    if not options.address_groups and not options.load_balancers:
        p.error("--no-address-groups with --no-load-balancer-addresses: nothing left to do")
    if options.url is not None and not options.load_balancers:
        p.error("--api-url runs the LoadBalancer loop only (address groups need --kubeconfig or a service account)")
    try:
        trio.run(_main, options)
    except ClientConfigError as exc:
        log.critical("no API server configuration", extra={"error": str(exc)})
        print(f"flock-controller: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
