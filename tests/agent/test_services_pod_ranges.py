"""The service proxy's "from a pod" ranges as the agent hands them over: a node's pod block lies
inside a cluster range as a rule (the lab's 2001:db8:0:1::/64 in 2001:db8::/48), and nftables
refuses an interval set with overlapping elements ("conflicting intervals specified"), which
refused the whole services table on every lab node (found bringing Services to the lab)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

import pytest

from flock.agent._services import pod_ranges
from flock.services import NodeView, ServicesConfig, compile_table, render_full
from flock.testing.netns import NetnsPool

NET = ipaddress.ip_network
LAB = (NET("2001:db8:0:1::/64"), NET("198.51.100.0/26"), NET("2001:db8::/48"), NET("198.51.100.0/24"))
NODE = NodeView("node1", (ipaddress.ip_address("2001:db8:ffff::101"), ipaddress.ip_address("192.0.2.11")))


def test_pod_ranges_are_collapsed_per_family() -> None:
    assert pod_ranges(LAB) == (NET("2001:db8::/48"), NET("198.51.100.0/24"))
    assert pod_ranges((NET("192.0.2.0/26"), NET("2001:db8::/64"), NET("192.0.2.64/26"))) == (
        NET("2001:db8::/64"),
        NET("192.0.2.0/25"),
    )
    assert pod_ranges(()) == ()


def _loads(pod_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> subprocess.CompletedProcess[str]:
    if shutil.which("nft") is None or os.geteuid() != 0:
        pytest.fail("this test needs root and nft (scripts/bootstrap installs nftables); CI runs as root")
    text = render_full(compile_table((), (), NODE, ServicesConfig(pod_cidrs=pod_cidrs)))
    with NetnsPool("fl-podrg-") as pool:
        ns = pool.create()
        return subprocess.run(
            ["ip", "netns", "exec", ns.name, "nft", "-f", "-"], input=text, capture_output=True, text=True, timeout=60
        )


@pytest.mark.root
def test_the_collapsed_ranges_load() -> None:
    done = _loads(pod_ranges(LAB))
    assert done.returncode == 0, done.stderr


@pytest.mark.root
def test_overlapping_pod_cidrs_load_as_given() -> None:
    # the compile collapses them itself too: whoever hands it overlapping ranges gets a table nft takes
    done = _loads(LAB)
    assert done.returncode == 0, done.stderr
