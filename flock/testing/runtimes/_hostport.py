"""hostPort checks for the runtime tests: the node's uplink addresses and another machine on the
uplink to probe them from, a server run inside a runtime's pod network namespace (by its path: a
CRI sandbox is only a pause process), and what flock's nft table says about a pod's addresses."""

from __future__ import annotations

import re
import subprocess
import sys

from flock.testing.agentlab import Lab
from flock.testing.netns import Netns
from flock.testing.policy_net import CLIENT, SERVER, stop

NODE6, NODE4 = "2001:db8:fffe::1", "192.0.2.1"  # the node's uplink addresses (192.0.2.1 is the lab's own)
OUT6, OUT4 = "2001:db8:fffe::2", "192.0.2.2"  # `lab.up`: another machine on the uplink


def address_uplink(lab: Lab) -> None:
    """Give the node an IPv6 uplink address next to the lab's IPv4 one, and ``lab.up`` one of each
    family on the same links (idempotent)."""
    for ns, dev, addrs in ((lab.node, "uplink", (f"{NODE6}/64",)), (lab.up, "eth0", (f"{OUT6}/64", f"{OUT4}/24"))):
        have = ns.ip("-o", "addr", "show", "dev", dev)
        for addr in addrs:
            if f" {addr} " not in have:
                ns.ip("addr", "add", addr, "dev", dev, *(("nodad",) if ":" in addr else ()))


def serve_in(netns_path: str, *specs: str) -> subprocess.Popen:
    """flock.testing.policy_net's SERVER ("80/tcp", "53/udp" …) in the network namespace at *netns_path*
    (``nsenter --net`` execs it in place: stopping the Popen stops the server)."""
    proc = subprocess.Popen(
        ["nsenter", f"--net={netns_path}", "--", sys.executable, "-c", SERVER, *specs],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        stop(proc)
        raise RuntimeError(f"the server in {netns_path} did not start")
    return proc


def probe_in(netns_path: str, addr: str, port: int, proto: str) -> bool:
    """flock.testing.policy_net's ``probe`` from the network namespace at *netns_path*."""
    argv = ["nsenter", f"--net={netns_path}", "--", sys.executable, "-c", CLIENT, addr, str(port), proto]
    return subprocess.run(argv, capture_output=True, text=True, timeout=20).returncode == 0


def flock_table(lab: Lab) -> str:
    """``nft list table inet flock`` in the node ("" when there is no table).  The tests look for a pod's
    addresses in it, not for a rendering: mapped, they are in the hostPort rules or maps (and the hairpin
    set); unmapped and deleted, they are nowhere in flock's table."""
    done = lab.node.run("nft", "list", "table", "inet", "flock", check=False)
    return done.stdout if done.returncode == 0 else ""


def mentions(lab: Lab, *addresses: object) -> list[str]:
    """The lines of flock's table that name any of *addresses* (as a whole address: 198.51.100.2 is not
    in 198.51.100.20)."""
    found = re.compile("|".join(rf"(?<![\w.:]){re.escape(str(a))}(?![\w]|\.\d)" for a in addresses))
    return [line.strip() for line in flock_table(lab).splitlines() if found.search(line)]


_GET = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())"


def http_get(src: Netns, addr: str, port: int, path: str) -> str | None:
    """*path*'s body fetched from http://addr:port in *src* (3 s); None when that fails.  (Python's
    urllib: the host's static busybox wget crashes resolving.)"""
    host = f"[{addr}]" if ":" in addr else addr
    done = src.run(sys.executable, "-c", _GET, f"http://{host}:{port}{path}", check=False)
    return done.stdout if done.returncode == 0 else None
