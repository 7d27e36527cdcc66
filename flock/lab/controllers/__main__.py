"""``python -m flock.lab.controllers --lab-dir DIR --kubeconfig FILE``: the lab's controllers (see the package)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from flock import logs
from flock.lab._lifecycle import api_client
from flock.lab._state import require_state
from flock.watchers import open_kube_client

from ._endpointslices import EndpointSliceController
from ._kubelet import KubeletStandIn
from ._run import run_controllers

log = logging.getLogger("flock.lab.controllers")


async def _main(lab_dir: Path, kubeconfig: Path) -> None:
    plan = require_state(lab_dir).plan
    async with open_kube_client(kubeconfig) as kube, trio.open_nursery() as nursery:
        await nursery.start(run_controllers, kube, EndpointSliceController(api_client(plan)), KubeletStandIn(plan))
        log.info("controllers running: endpointslices, kubelet stand-in", extra={"lab": str(plan.dir)})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flock.lab.controllers", description=__doc__.split("\n")[0])
    p.add_argument("--lab-dir", type=Path, required=True)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    args = p.parse_args(argv)
    logs.configure(fmt=args.log_format)
    try:
        trio.run(_main, args.lab_dir, args.kubeconfig)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
