"""``flock-controller [--kubeconfig PATH | --api-url URL]``: flock-controller (see the package).

In a cluster it runs with its service account (no flag); ``--kubeconfig`` as the agent's; ``--api-url``
speaks plain HTTP without credentials (the lab's API server)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence

import trio

from flock import logs
from flock.watchers import ClientConfigError, open_kube_client

from ._api import HttpApi, KubeApi, ObjectApi
from ._lease import Elector, LeaseSettings
from ._loop import LoadBalancerController
from ._watch import WatchingController

log = logging.getLogger("flock.controller")


async def _run(api: ObjectApi, identity: str, settings: LeaseSettings, resync: float) -> None:
    elector = Elector(api, identity, settings)
    controller = LoadBalancerController(api, elector.confirm, resync_seconds=resync, identity=identity)
    log.info("standing for election", extra={"identity": identity, "lease": f"{settings.namespace}/{settings.name}"})
    await elector.run(controller.run)


async def _main(url: str | None, kubeconfig: str | None, identity: str, settings: LeaseSettings, resync: float) -> None:
    if url is not None:  # plain HTTP (the lab's, tests'): a pass every resync
        await _run(HttpApi(url), identity, settings, resync)
        return
    async with open_kube_client(kubeconfig) as client:  # a cluster's: a pass per change, by watches
        api = KubeApi(client)
        elector = Elector(api, identity, settings)
        controller = WatchingController(api, client, elector.confirm, identity=identity)
        log.info(
            "standing for election", extra={"identity": identity, "lease": f"{settings.namespace}/{settings.name}"}
        )
        await elector.run(controller.run)


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
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    args = p.parse_args(argv)
    logs.configure(fmt=args.log_format)
    settings = LeaseSettings(namespace=args.lease_namespace, name=args.lease_name)
    try:
        trio.run(_main, args.api_url, args.kubeconfig, args.identity, settings, args.resync_seconds)
    except ClientConfigError as exc:
        log.critical("no API server configuration", extra={"error": str(exc)})
        print(f"flock-controller: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
