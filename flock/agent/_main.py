"""``flock-agent``'s entry point: flags → settings → logging → the composed tree → exit status."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence

from flock import logs

from ._cli import parse_args
from ._compose import run_agent
from ._crash import CrashPoint
from ._root import serve


def main(argv: Sequence[str] | None = None) -> None:
    settings, args = parse_args(argv, os.environ)
    try:
        crash = CrashPoint.from_environ(os.environ)
    except ValueError as exc:
        sys.exit(f"flock-agent: {exc}")
    logs.configure(level=args.log_level, fmt=args.log_format)
    sys.exit(serve(functools.partial(run_agent, settings, crash=crash)))
