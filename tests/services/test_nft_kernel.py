"""Debian's nft accepts the rendered text, and an update leaves the kernel holding what a full load would.

One namespace follows a chain of random cluster states by :func:`render_update`
alone; after each step its table (``nft -j list table``, normalised: handles
dropped, elements sorted) must equal that of a second namespace loaded with
the full text of the same state.  ``nft -c`` checks the text of a large table.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from flock.services import (
    AllowList,
    EndpointSlice,
    NodeView,
    Service,
    ServicesConfig,
    ServicesTable,
    compile_table,
    render_full,
    render_update,
)
from flock.testing import services as objects
from flock.testing.netns import Netns, NetnsPool

pytestmark = pytest.mark.root

NODE = NodeView("node-a", (ipaddress.ip_address("2001:db8:ffff::1"), ipaddress.ip_address("198.51.100.1")))
CONFIG = ServicesConfig(
    pod_cidrs=(ipaddress.ip_network("2001:db8:10::/64"), ipaddress.ip_network("192.0.2.0/24")),
    allow=AllowList.of_cidrs((ipaddress.ip_network("198.51.100.0/25"),)),
)


@pytest.fixture(scope="module")
def pool() -> Iterator[NetnsPool]:
    if shutil.which("nft") is None:
        pytest.fail("nft not found: these tests check the services table with Debian's nftables package")
    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces, nftables); CI runs as root")
    with NetnsPool("fl-svcnft-") as p:
        yield p


def nft(ns: Netns, *args: str, script: str | None = None) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", ns.name, "nft", *args], input=script, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        shown = (script or "")[:3000]
        raise AssertionError(f"nft {' '.join(args)} refused: {done.stderr.strip()[:3000]}\n{shown}")
    return done.stdout


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "handle"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def listing(ns: Netns) -> dict[str, Any]:
    """The table as nft lists it: chains with their rules in order, sets and maps with sorted elements."""
    items = json.loads(nft(ns, "-j", "list", "table", "inet", "flock-services"))["nftables"]
    out: dict[str, Any] = {"chains": {}, "rules": {}, "sets": {}, "maps": {}}
    for item in items:
        (kind, body), *_ = item.items()
        body = _strip(body)
        if kind == "chain":
            out["chains"][body["name"]] = body
        elif kind == "rule":
            out["rules"].setdefault(body["chain"], []).append(body["expr"])
        elif kind in ("set", "map"):
            elements = body.pop("elem", [])
            out[kind + "s"][body["name"]] = (body, sorted(json.dumps(e, sort_keys=True) for e in elements))
    return out


def _state(rng: random.Random) -> ServicesTable:
    services, slices = objects.random_cluster(rng, max_services=6)
    return compile_table(
        [Service.from_object(s) for s in services], [EndpointSlice.from_object(s) for s in slices], NODE, CONFIG
    )


def test_updates_leave_what_a_full_load_leaves(pool: NetnsPool) -> None:
    follower, reference = pool.create("follow"), pool.create("ref")
    rng = random.Random(33)
    applied = _state(rng)
    nft(follower, "-f", "-", script=render_full(applied))
    for _ in range(12):
        target = _state(rng)
        update = render_update(applied, target)
        assert update is not None
        if update:
            nft(follower, "-f", "-", script=update)
        applied = target
        nft(reference, "-f", "-", script=render_full(target))
        assert listing(follower) == listing(reference)


def test_nft_checks_three_hundred_services(pool: NetnsPool) -> None:
    services, slices = [], []
    for i in range(300):
        raw = objects.service(
            f"s{i}",
            [f"fd00:96::{i + 1:x}", f"203.0.113.{i % 250 + 1}"],
            [objects.port("http", 80, target=8080, node_port=30000 + i), objects.port("dns", 53, protocol="UDP")],
            type="NodePort",
            affinity_timeout=60 if i % 10 == 0 else None,
            etp="Local" if i % 7 == 0 else None,
        )
        services.append(Service.from_object(raw))
        for family, fmt in (("IPv6", "2001:db8:10::{:x}:{}"), ("IPv4", "192.0.2.{1}")):
            eps = [objects.endpoint(fmt.format(i, j + 1), ("node-a", "node-b")[j % 2]) for j in range(2)]
            ports = [objects.slice_port("http", 8080), objects.slice_port("dns", 5353, "UDP")]
            slices.append(EndpointSlice.from_object(objects.endpoint_slice(f"s{i}", eps, ports, address_type=family)))
    table = compile_table(services, slices, NODE, CONFIG)
    ns = pool.create("check")
    nft(ns, "-c", "-f", "-", script=render_full(table))
