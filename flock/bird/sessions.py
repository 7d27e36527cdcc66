"""BGP session state, read from the running BIRD (``birdc show protocols``).

What ``/readyz`` shows about BGP: each configured peer whose session is not
Established, with BIRD's own words for why (and, for a peer with a password,
the hint an operator needs: a TCP MD5 mismatch drops every segment silently,
so the session just never opens).
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable, Mapping

import attrs
import trio

from flock.bird.reloader import ProcessRunner, run_process
from flock.model import NodeConfig

log = logging.getLogger("flock.bird")

POLL_SECONDS = 2.0


@attrs.frozen
class Session:
    protocol: str  # BIRD's protocol name: bgp_<peer>
    state: str  # up, start, down …
    info: str  # Established, Active, Connect, … and BIRD's last message

    @property
    def established(self) -> bool:
        return self.info.startswith("Established")


def parse_protocols(text: str) -> dict[str, Session]:
    """The BGP rows of ``birdc show protocols``, by protocol name."""
    out = {}
    for line in text.splitlines():
        fields = line.split()
        # Name Proto Table State Since Info…; Since is one or two words (date and time).
        if len(fields) >= 5 and fields[1] == "BGP":
            rest = fields[4:]
            if len(rest) > 1 and ":" in rest[1] and "-" in rest[0]:
                rest = rest[1:]
            out[fields[0]] = Session(fields[0], fields[3], " ".join(rest[1:]))
    return out


def session_problems(node: NodeConfig | None, sessions: Mapping[str, Session] | None, namespace: str) -> list[str]:
    """One line per configured peer whose session is not Established (pure)."""
    if node is None or node.bgp is None or sessions is None:
        return []
    out = []
    for peer in sorted(node.bgp.peers, key=lambda p: p.name):
        session = sessions.get(f"bgp_{peer.name}")
        if session is not None and session.established:
            continue
        what = "not configured in BIRD yet" if session is None else f"{session.state}: {session.info or 'no info'}"
        line = f"BGP peer {peer.name} ({peer.address}, AS {peer.asn}) not established: {what}"
        if peer.password is not None:
            line += (
                f"; it signs with the TCP MD5 password from Secret {namespace}/{peer.password.name} "
                f"key {peer.password.key!r}: a password that differs from the peer's drops every segment, "
                "so the session never opens"
            )
        out.append(line)
    return out


@attrs.define(eq=False)
class SessionMonitor:
    """Supervised service polling BIRD's BGP sessions every ``poll`` seconds.

    Error handling: a BIRD that does not answer leaves :attr:`sessions` None
    (nothing is claimed about BGP then); nothing propagates.
    """

    control_socket: pathlib.Path = attrs.field(converter=pathlib.Path)
    runner: ProcessRunner = run_process
    birdc: str = "birdc"
    poll: float = POLL_SECONDS
    #: Called after every poll (the agent turns the sessions into /readyz notes).
    on_refresh: Callable[[], None] = lambda: None
    sessions: dict[str, Session] | None = attrs.field(init=False, default=None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self.refresh()
            await trio.sleep(self.poll)

    async def refresh(self) -> None:
        argv = [self.birdc, "-s", str(self.control_socket), "show", "protocols"]
        result = None
        with trio.move_on_after(self.poll * 2):
            try:
                result = await self.runner(argv)
            except OSError:
                result = None
        if result is None or result.returncode != 0:
            self.sessions = None
        else:
            out = result.stdout.decode(errors="replace") if isinstance(result.stdout, bytes) else str(result.stdout)
            self.sessions = parse_protocols(out)
        self.on_refresh()


__all__ = ["Session", "SessionMonitor", "parse_protocols", "session_problems"]
