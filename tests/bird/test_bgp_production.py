"""Passwords from Secrets, health-aware anycast, BGP session state: the agent-side logic, in virtual time.

The informers read the fake API server's store directly (flock.testing.StoreSource),
so the tests run under ``autojump_clock`` and assert exact virtual times.
"""

from __future__ import annotations

import ipaddress
import math
import pathlib
import subprocess
from collections.abc import AsyncIterator, Sequence

import trio

from flock.apiserver import PODS, SECRETS, ObjectStore, nodeconfig_object, pod_object, secret_object
from flock.bird import BirdInputs, BirdReloader, RenderSettings
from flock.bird.anycast import follow_pod_readiness
from flock.bird.passwords import BgpPasswords, resolve_passwords
from flock.bird.sessions import SessionMonitor, parse_protocols, session_problems
from flock.model import Allocation, NodeConfig
from flock.testing import StoreSource
from flock.watchers import PodWatcher

NS = "flock-system"
ANYCAST = ipaddress.ip_address("2001:db8:53::53")


def node(*peers: dict) -> NodeConfig:
    return NodeConfig.from_object(
        nodeconfig_object("host001", bgp={"asn": 64512, "routerID": "192.0.2.11", "peers": list(peers)})
    )


def tor(name: str, secret: str = "bgp", key: str | None = None) -> dict:
    return {
        "name": name,
        "address": "2001:db8:ffff::1",
        "asn": 64500,
        "password": {"secretKeyRef": {"name": secret, "key": key or name}},
    }


# --- passwords ----------------------------------------------------------------


def test_resolve_passwords_names_what_is_wrong_without_values() -> None:
    n = node(
        tor("a"), tor("b"), tor("c"), tor("d", secret="other"), tor("e", secret="gone"), {**tor("f"), "password": None}
    )
    secrets = {"bgp": {"a": b"good-one", "c": b'has"quote'}, "gone": None}
    passwords, problems = resolve_passwords(n, NS, secrets)
    assert passwords == {"a": "good-one"}
    assert problems == {
        "b": f"Secret {NS}/bgp has no key 'b' (keys: a, c)",
        "c": f"Secret {NS}/bgp key 'c': not a usable BGP password "
        "(expected 1..80 printable ASCII characters without '\"' or '\\')",
        "d": f"Secret {NS}/other not read yet",
        "e": f"Secret {NS}/gone not found",
    }
    assert not any('has"quote' in p for p in problems.values())


class Pokes:
    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self) -> None:
        self.times.append(round(trio.current_time(), 6))


async def test_passwords_follow_secrets_and_the_nodeconfig(autojump_clock) -> None:
    store = ObjectStore()
    send, receive = trio.open_memory_channel[NodeConfig](math.inf)
    pokes = Pokes()

    def source(namespace: str, name: str) -> StoreSource:
        return StoreSource(store, SECRETS, f"metadata.name={name},metadata.namespace={namespace}")

    passwords = BgpPasswords(NS, source, pokes)

    async def values() -> AsyncIterator[NodeConfig]:
        async for n in receive:
            yield n

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(passwords.run, values())
            send.send_nowait(node(tor("tor1")))
            await trio.sleep(1)
            assert passwords.passwords == {} and passwords.problems == {"tor1": f"Secret {NS}/bgp not found"}
            # A Secret of that name in another namespace is not ours.
            store.create(SECRETS, secret_object("default", "bgp", {"tor1": "wrong-namespace"}))
            await trio.sleep(1)
            assert passwords.passwords == {}
            store.create(SECRETS, secret_object(NS, "bgp", {"tor1": "first"}))
            await trio.sleep(0.1)
            assert passwords.passwords == {"tor1": "first"} and passwords.problems == {}
            store.patch(SECRETS, "bgp", {"stringData": {"tor1": "second"}}, NS)
            await trio.sleep(0.1)
            assert passwords.passwords == {"tor1": "second"}
            # The NodeConfig moves the peer to another Secret: the old one is no longer watched.
            store.create(SECRETS, secret_object(NS, "bgp2", {"k": "third"}))
            send.send_nowait(node(tor("tor1", secret="bgp2", key="k")))
            await trio.sleep(0.1)
            assert passwords.passwords == {"tor1": "third"}
            store.patch(SECRETS, "bgp", {"stringData": {"tor1": "ignored"}}, NS)
            await trio.sleep(0.1)
            assert passwords.passwords == {"tor1": "third"}
            nursery.cancel_scope.cancel()
    assert len(pokes.times) >= 5


# --- health-aware anycast ------------------------------------------------------


def anycast_alloc(cid: str, pod: str, uid: str = "") -> Allocation:
    return Allocation(
        cid, "dns", pod, uid, "eth0", "/run/netns/x", ipaddress.IPv6Address(f"2001:db8:0:1::{cid}"), anycast=(ANYCAST,)
    )


def ready_patch(ready: bool) -> dict:
    return {
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": str(ready)}]}
    }


def test_anycast_is_announced_while_one_local_pod_is_ready() -> None:
    n = node()
    a, b = anycast_alloc("a", "r-1", "uid-1"), anycast_alloc("b", "r-2", "uid-2")
    from flock.model import PodInfo

    def pod(name: str, uid: str, status: dict | None) -> PodInfo:
        return PodInfo.from_object(
            {
                **pod_object("dns", name, "host001"),
                "metadata": {"namespace": "dns", "name": name, "uid": uid},
                **(status or {}),
            }
        )

    cases = [
        ({}, {ANYCAST}),  # not in the cache (agent restarting, no API): keep announcing
        ({"dns/r-1": pod("r-1", "uid-1", None)}, {ANYCAST}),  # no conditions: not run by a kubelet
        (
            {"dns/r-1": pod("r-1", "uid-1", ready_patch(False)), "dns/r-2": pod("r-2", "uid-2", ready_patch(True))},
            {ANYCAST},
        ),
        (
            {"dns/r-1": pod("r-1", "uid-1", ready_patch(False)), "dns/r-2": pod("r-2", "uid-2", ready_patch(False))},
            set(),
        ),
        # r-2 was replaced by a new pod of the same name (another UID): a's own pod decides alone.
        (
            {"dns/r-1": pod("r-1", "uid-1", ready_patch(False)), "dns/r-2": pod("r-2", "uid-9", ready_patch(True))},
            set(),
        ),
        # r-1 has conditions but no Ready one (not ready); r-2 is not in the cache (announced).
        (
            {"dns/r-1": pod("r-1", "uid-1", {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}})},
            {ANYCAST},
        ),
    ]
    for pods, announced in cases:
        inputs = BirdInputs.collect(n, [a, b], pods=pods)
        assert inputs.anycast == announced, pods
        assert inputs.withheld == {ANYCAST} - announced


async def test_the_last_ready_pod_going_unready_withdraws_within_the_debounce(autojump_clock, tmp_path) -> None:
    """Readiness flip → pod informer → poke → reloader renders without the address at +0.5 s."""
    store = ObjectStore()
    n = node({"name": "tor1", "address": "2001:db8:ffff::1", "asn": 64500})
    store.create(PODS, {**pod_object("dns", "r-1", "host001"), **ready_patch(True)})
    alloc = anycast_alloc("a", "r-1")
    watcher = PodWatcher(StoreSource(store, PODS, "spec.nodeName=host001"), "host001")
    checks: list[tuple[float, bool]] = []

    async def runner(argv: Sequence[str]) -> subprocess.CompletedProcess:
        if argv[0] == "bird":
            # Virtual time: read on the Trio thread (a worker thread would let the clock jump).
            checks.append((round(trio.current_time(), 6), f"{ANYCAST}/128" in pathlib.Path(argv[3]).read_text()))  # noqa: ASYNC240
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    reloader = BirdReloader(
        tmp_path / "bird.conf",
        tmp_path / "bird.ctl",
        RenderSettings(route_protocol=70),
        lambda: BirdInputs.collect(n, [alloc], pods=watcher.pods),
        runner,
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            await nursery.start(follow_pod_readiness, watcher, reloader.poke)
            await nursery.start(reloader.run)
            await trio.sleep(10)
            store.patch(PODS, "r-1", ready_patch(False), "dns")
            await trio.sleep(10)
            store.patch(PODS, "r-1", {"metadata": {"labels": {"x": "y"}}}, "dns")  # not a readiness change
            await trio.sleep(10)
            store.patch(PODS, "r-1", ready_patch(True), "dns")
            await trio.sleep(10)
            nursery.cancel_scope.cancel()
    assert checks == [(0.5, True), (10.5, False), (30.5, True)]


# --- BGP sessions ---------------------------------------------------------------

PROTOCOLS = """\
BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
flock_device Device   ---        up     20:32:50.705
bgp_tor1   BGP        ---        start  2026-11-20 20:32:50  Connect       Socket: Connection timed out
bgp_tor2   BGP        ---        up     20:33:26.224  Established
"""


def test_session_problems_say_why_and_hint_at_the_password() -> None:
    sessions = parse_protocols(PROTOCOLS)
    assert sorted(sessions) == ["bgp_tor1", "bgp_tor2"] and sessions["bgp_tor2"].established
    n = node(
        tor("tor1"),
        {"name": "tor2", "address": "192.0.2.2", "asn": 64500},
        {"name": "tor3", "address": "192.0.2.3", "asn": 64500},
    )
    problems = session_problems(n, sessions, NS)
    assert problems[0].startswith(
        "BGP peer tor1 (2001:db8:ffff::1, AS 64500) not established: start: Connect Socket: Connection timed out; "
        f"it signs with the TCP MD5 password from Secret {NS}/bgp key 'tor1'"
    )
    assert problems[1] == "BGP peer tor3 (192.0.2.3, AS 64500) not established: not configured in BIRD yet"
    assert session_problems(n, None, NS) == []  # BIRD not answering: nothing claimed


async def test_session_monitor_reads_birdc_and_forgets_a_silent_bird(autojump_clock) -> None:
    answers = [
        subprocess.CompletedProcess([], 0, PROTOCOLS.encode(), b""),
        subprocess.CompletedProcess([], 1, b"", b""),
    ]

    async def runner(argv: Sequence[str]) -> subprocess.CompletedProcess:
        assert list(argv[1:]) == ["-s", "/run/flock/bird.ctl", "show", "protocols"]
        return answers.pop(0) if answers else subprocess.CompletedProcess([], 1, b"", b"")

    monitor = SessionMonitor("/run/flock/bird.ctl", runner)
    with trio.fail_after(60):
        await monitor.refresh()
        assert monitor.sessions is not None and set(monitor.sessions) == {"bgp_tor1", "bgp_tor2"}
        await monitor.refresh()
        assert monitor.sessions is None
