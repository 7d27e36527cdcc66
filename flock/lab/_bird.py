"""BIRD in the lab: the fabric's route-server config, a node's bootstrap config,
and BGP session state read with ``birdc show protocols``."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio

from flock.lab._plan import BFD_INTERVAL_MS, BFD_MULTIPLIER, FABRIC4, FABRIC_ASN, LabPlan, NodePlan

# Short timers, as the agent's --bgp-lab-timers: sessions come up in about a second.
_TIMERS = """\
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  hold time 3;
  keepalive time 1;"""


def fabric_config(plan: LabPlan) -> str:
    """A transparent route server (RFC 7947) for every node: routes pass with the
    originating node's next hop, so traffic goes node to node over the segment.

    As a production ToR would: graceful restart (it keeps a restarting node's
    routes), BFD (a dead node or link is withdrawn in ~300 ms), TCP MD5 with
    each node's password, and the nodes' communities passed on unchanged."""
    peers = "\n".join(
        f"protocol bgp {node.name} from node_peer {{\n"
        f"  neighbor {node.addr6} as {node.asn};\n"
        f'  password "{node.bgp_password}";\n'
        f"  bfd {node.fabric_bfd};\n"
        "}\n"
        for node in plan.nodes
    )
    return f"""\
# flock-lab fabric: BGP route server for the lab's nodes (rendered by flock-lab up).
log stderr {{ info, remote, warning, error, auth, fatal, bug }};
router id {FABRIC4};

protocol device {{
}}

protocol bfd {{
  interface "*" {{
    min rx interval {BFD_INTERVAL_MS} ms;
    min tx interval {BFD_INTERVAL_MS} ms;
    multiplier {BFD_MULTIPLIER};
  }};
}}

template bgp node_peer {{
  local as {FABRIC_ASN};
  rs client;
  graceful restart on;
{_TIMERS}
  ipv6 {{
    import all;
    export all;
  }};
  ipv4 {{
    extended next hop on;
    import all;
    export all;
  }};
}}

{peers}"""


def node_bootstrap_config(node: NodePlan) -> str:
    """What a node's BIRD starts with until its agent renders the real config
    (the same as deploy/bird-bootstrap.yaml, with the node's router id)."""
    return f"""\
# flock bootstrap: replaced by flock-agent once this node's NodeConfig is loaded.
log stderr all;
router id {node.addr4};
# Named as in the rendered config: BIRD keeps it across `configure`.  A device
# protocol replaced by one of another name forgets every interface until its
# next scan (a minute), and BGP stays Idle until then.
protocol device flock_device {{
}}
"""


@attrs.frozen
class BgpSession:
    name: str
    state: str  # BIRD's protocol state: up, start, down, …
    info: str  # Established, Active, Connect, …

    @property
    def established(self) -> bool:
        return self.info.startswith("Established")


def parse_protocols(text: str) -> list[BgpSession]:
    """The BGP protocols of ``birdc show protocols`` output."""
    sessions = []
    for line in text.splitlines():
        fields = line.split()
        # Name Proto Table State Since Info…; Since is one or two words (date and time).
        if len(fields) >= 5 and fields[1] == "BGP":
            rest = fields[4:]
            if len(rest) > 1 and ":" in rest[1] and "-" in rest[0]:
                rest = rest[1:]
            sessions.append(BgpSession(fields[0], fields[3], " ".join(rest[1:])))
    return sessions


async def bgp_sessions(ctl: Path) -> list[BgpSession] | None:
    """The BGP sessions of the BIRD behind *ctl*; None when it does not answer."""
    proc = await trio.run_process(
        ["birdc", "-s", str(ctl), "show", "protocols"], capture_stdout=True, capture_stderr=True, check=False
    )
    if proc.returncode != 0:
        return None
    return parse_protocols(proc.stdout.decode(errors="replace"))


def all_established(sessions: list[BgpSession] | None, expected: int) -> bool:
    return sessions is not None and len(sessions) == expected and all(s.established for s in sessions)
