"""``python -m flock.controller --api-url URL``: flock-controller (see the package)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence

import trio

from flock import logs

from ._api import HttpApi
from ._lease import Elector, LeaseSettings
from ._loop import LoadBalancerController

log = logging.getLogger("flock.controller")


async def _main(url: str, identity: str, settings: LeaseSettings, resync: float) -> None:
    api = HttpApi(url)
    elector = Elector(api, identity, settings)
    controller = LoadBalancerController(api, elector.confirm, resync_seconds=resync)
    log.info("standing for election", extra={"identity": identity, "lease": f"{settings.namespace}/{settings.name}"})
    await elector.run(controller.run)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="flock-controller", description=__doc__.split("\n")[0])
    p.add_argument("--api-url", required=True, help="the API server over plain HTTP (the lab's)")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}")
    p.add_argument("--lease-namespace", default="kube-system")
    p.add_argument("--lease-name", default="flock-controller")
    p.add_argument("--resync-seconds", type=float, default=1.0)
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    args = p.parse_args(argv)
    logs.configure(fmt=args.log_format)
    settings = LeaseSettings(namespace=args.lease_namespace, name=args.lease_name)
    try:
        trio.run(_main, args.api_url, args.identity, settings, args.resync_seconds)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
