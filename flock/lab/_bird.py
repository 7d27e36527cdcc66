"""BIRD in the lab: the fabric's route-server config, a node's bootstrap config,
and BGP session state read with ``birdc show protocols``."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio

from flock.lab._plan import (
    BFD_INTERVAL_MS,
    BFD_MULTIPLIER,
    FABRIC4,
    FABRIC_ASN,
    INTERNET4,
    INTERNET6,
    INTERNET_ASN,
    INTERNET_GATEWAY4,
    INTERNET_GATEWAY6,
    SERVICE_EXTERNAL_RANGES,
    LabPlan,
    NodePlan,
)

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
    each node's password, the nodes' communities passed on unchanged, and the
    graceful-shutdown community honoured (RFC 8326: local preference 0, so a
    leaving node's routes drop out of the ECMP set while others are there).

    What it learns goes into the fabric namespace's kernel, the equal best
    routes of an address merged into one ECMP route (a Service address that
    several nodes announce), so the fabric forwards by what BGP says; with
    ``plan.internet`` the Service routes are passed on to the internet's
    router (next hop self), which learns them the same way."""
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

# RFC 8326: a route that says its node is leaving is the last choice.
filter from_node {{
  if (65535, 0) ~ bgp_community then bgp_local_pref = 0;
  accept;
}}

# The fabric namespace forwards by what BGP says: ECMP over the nodes announcing an address.
protocol kernel fabric_kernel6 {{
  merge paths on;
  ipv6 {{ export all; import none; }};
}}
protocol kernel fabric_kernel4 {{
  merge paths on;
  ipv4 {{ export all; import none; }};
}}

template bgp node_peer {{
  local as {FABRIC_ASN};
  rs client;
  graceful restart on;
{_TIMERS}
  ipv6 {{
    import filter from_node;
    export all;
  }};
  ipv4 {{
    extended next hop on;
    import filter from_node;
    export all;
  }};
}}

{peers}{_internet_peers(plan)}"""


def _service_filter(name: str, version: int) -> str:
    nets = ", ".join(f"{n}+" for n in SERVICE_EXTERNAL_RANGES if n.version == version)
    return f"""filter {name} {{
  if net ~ [ {nets} ] then accept;
  reject;
}}
"""


def _internet_peers(plan: LabPlan) -> str:
    """The fabric's sessions to the internet's router: the Service routes it holds, next hop self."""
    if not plan.internet:
        return ""
    return f"""
{_service_filter("services6", 6)}
{_service_filter("services4", 4)}
protocol bgp internet6 {{
  local as {FABRIC_ASN};
  neighbor {INTERNET6} as {INTERNET_ASN};
{_TIMERS}
  ipv6 {{ import none; export filter services6; next hop self; }};
}}

protocol bgp internet4 {{
  local as {FABRIC_ASN};
  neighbor {INTERNET4} as {INTERNET_ASN};
{_TIMERS}
  ipv4 {{ import none; export filter services4; next hop self; }};
}}
"""


def internet_config() -> str:
    """The internet's router: what the fabric passes on (the Service addresses) into its kernel."""
    return f"""\
# flock-lab internet: learns the routes the fabric holds (rendered by flock-lab up --internet).
log stderr {{ info, remote, warning, error, auth, fatal, bug }};
router id {INTERNET4};

protocol device {{
}}

protocol kernel internet_kernel6 {{
  merge paths on;
  ipv6 {{ export all; import none; }};
}}
protocol kernel internet_kernel4 {{
  merge paths on;
  ipv4 {{ export all; import none; }};
}}

protocol bgp fabric6 {{
  local as {INTERNET_ASN};
  neighbor {INTERNET_GATEWAY6} as {FABRIC_ASN};
{_TIMERS}
  ipv6 {{ import all; export none; }};
}}

protocol bgp fabric4 {{
  local as {INTERNET_ASN};
  neighbor {INTERNET_GATEWAY4} as {FABRIC_ASN};
{_TIMERS}
  ipv4 {{ import all; export none; }};
}}
"""


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
