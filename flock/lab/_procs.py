"""Processes identified by PID *and* start time, so a recycled PID is never signalled."""

from __future__ import annotations

import os
import signal

import attrs


@attrs.frozen
class ProcRef:
    pid: int
    start_time: int  # clock ticks since boot, field 22 of /proc/<pid>/stat


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold blanks.
    return text[text.rindex(")") + 2 :].split()


def proc_ref(pid: int) -> ProcRef | None:
    fields = _stat_fields(pid)
    return None if fields is None else ProcRef(pid, int(fields[19]))


def is_running(ref: ProcRef) -> bool:
    """The very process *ref* names exists and is not a zombie."""
    fields = _stat_fields(ref.pid)
    return fields is not None and int(fields[19]) == ref.start_time and fields[0] not in ("Z", "X")


def signal_if_running(ref: ProcRef, signum: signal.Signals) -> bool:
    if not is_running(ref):
        return False
    try:
        os.kill(ref.pid, signum)
    except ProcessLookupError:
        return False
    return True


def reap_if_child(pid: int) -> None:
    """Collect *pid*'s exit status if it is our child (else its parent or init does)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
