"""hostPort in the pod handler: ``runtimeConfig.portMappings`` read and refused with the field named,
claims on host ports (a second pod on the same hostIP:hostPort/protocol gets code 111 and nothing is
taken; two ADDs racing for one port: exactly one wins), the mappings and the network name stored with
the allocation, claims given back by DEL and GC and rebuilt from the store, GC scoped to its network."""

from __future__ import annotations

import contextlib
import ipaddress

import attrs
import pytest
import trio

from flock import errors
from flock.apiserver import PODS, ObjectStore, nodeconfig_object, pod_object
from flock.model import Allocation, AllocationState, NodeConfig, PortMapping
from flock.pods import HOST_PORT_IN_USE, MAX_PORT_MAPPINGS, HostPortClaims, HostPortInUse, InvalidNetworkConfig
from flock.pods import port_mappings as parse
from flock.policy._model import Protocol
from flock.policy._ruleset import HostPort
from flock.policy._service import hostports_of
from flock.testing import StoreSource
from flock.testing.pods import MemoryAllocations, MemoryKernel, request, serving_handler
from flock.watchers import PodWatcher

NODE = "host001"
NODE_CONFIG = NodeConfig.from_object(
    nodeconfig_object(NODE, "2001:db8:0:1::/64", cidr4="198.51.100.0/28", families={"ipv6": True, "ipv4": True})
)
A = "flock.fritzlab.net/"
ip = ipaddress.ip_address


def ports(*mappings: dict) -> dict:
    return {"runtimeConfig": {"portMappings": list(mappings)}}


def m(host_port: object, container_port: object = 80, protocol: object = "tcp", host_ip: object = None) -> dict:
    out = {"hostPort": host_port, "containerPort": container_port, "protocol": protocol}
    if host_ip is not None:
        out["hostIP"] = host_ip
    return out


# -- reading runtimeConfig.portMappings --------------------------------------------------------------


def test_mappings_are_read_normalised_and_deduplicated() -> None:
    assert parse({}) == () and parse({"runtimeConfig": {}}) == () and parse(ports()) == ()
    got = parse(
        ports(
            {"hostPort": 8080, "containerPort": 80},  # protocol defaults to tcp
            m(8080, 80, "TCP"),  # the same again (upper case, as Kubernetes spells it): kept once
            m(53, 53, "udp", ""),  # hostIP "" is none
            m(9090, 90, "sctp", "2001:db8::1"),
            m(9091, 91, "tcp", "0.0.0.0"),  # unspecified: any IPv4 address (portmap, docker)
            {"HostPort": 9092, "ContainerPort": 92, "Protocol": "UDP", "HostIP": ""},  # go-cni's keys (containerd)
        )
    )
    assert got == (
        PortMapping(8080, 80, "tcp"),
        PortMapping(53, 53, "udp"),
        PortMapping(9090, 90, "sctp", ip("2001:db8::1")),
        PortMapping(9091, 91, "tcp", ip("0.0.0.0")),
        PortMapping(9092, 92, "udp"),
    )
    assert got[3].any_host and got[3].families((6, 4)) == (4,) and got[2].families((4,)) == ()
    # ::ffff:192.0.2.1 is 192.0.2.1
    assert parse(ports(m(80, 80, "tcp", "::ffff:192.0.2.1")))[0].host_ip == ip("192.0.2.1")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"runtimeConfig": []}, "runtimeConfig="),
        (ports() | {"runtimeConfig": {"portMappings": {"hostPort": 1}}}, "runtimeConfig.portMappings="),
        (ports("8080:80"), "runtimeConfig.portMappings[0]="),
        (ports(m(0)), "runtimeConfig.portMappings[0].hostPort=0"),
        (ports(m(65536)), "runtimeConfig.portMappings[0].hostPort=65536"),
        (ports(m(True)), "runtimeConfig.portMappings[0].hostPort=True"),
        (ports(m("80")), "runtimeConfig.portMappings[0].hostPort='80'"),
        (ports(m(80, 0)), "runtimeConfig.portMappings[0].containerPort=0"),
        (ports(m(80, None)), "runtimeConfig.portMappings[0].containerPort=None"),
        (ports(m(80, 80, "icmp")), "runtimeConfig.portMappings[0].protocol='icmp'"),
        (ports(m(80, 80, 6)), "runtimeConfig.portMappings[0].protocol=6"),
        (ports(m(80), m(81, 80, "tcp", "198.51.100.300")), "runtimeConfig.portMappings[1].hostIP='198.51.100.300'"),
        (ports(m(80, 80, "tcp", ["::1"])), "runtimeConfig.portMappings[0].hostIP=['::1']"),
        (ports(m(80, 80, "tcp", "fe80::1%eth0")), "runtimeConfig.portMappings[0].hostIP='fe80::1%eth0'"),
        (ports(m(80, 80, "tcp", "fe80::1%x}\nflush")), "runtimeConfig.portMappings[0].hostIP="),
        (ports(m(80, 80, "tcp", "127.0.0.1")), "runtimeConfig.portMappings[0].hostIP='127.0.0.1'"),
        (ports(m(80, 80, "tcp", "::1")), "runtimeConfig.portMappings[0].hostIP='::1'"),
        (ports(m(80, 80, "tcp", "::ffff:127.0.0.1")), "runtimeConfig.portMappings[0].hostIP='::ffff:127.0.0.1'"),
        (ports(*[m(p) for p in range(1, MAX_PORT_MAPPINGS + 2)]), "runtimeConfig.portMappings=[{"),
    ],
)
def test_bad_mappings_are_code_7_naming_the_field_and_a_bounded_value(config: dict, field: str) -> None:
    with pytest.raises(InvalidNetworkConfig) as info:
        parse(config)
    assert info.value.details.startswith(field), info.value.details
    assert len(info.value.details) < 400


def test_a_huge_value_is_quoted_by_its_head() -> None:
    with pytest.raises(InvalidNetworkConfig) as info:
        parse(ports(m(80, 80, "x" * 100_000)))
    assert "100000 characters" in info.value.details and len(info.value.details) < 300


def test_mappings_of_one_pod_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(InvalidNetworkConfig, match="8080/tcp → 80 is also asked for"):
        parse(ports(m(8080, 80), m(8080, 81, "tcp", "192.0.2.1")))
    # different protocols or families do not contradict
    assert len(parse(ports(m(8080, 80), m(8080, 81, "udp")))) == 2
    assert len(parse(ports(m(8080, 80, "tcp", "192.0.2.1"), m(8080, 81, "tcp", "2001:db8::1")))) == 2


# -- claims ----------------------------------------------------------------------------------------


def alloc(cid: str, *mappings: PortMapping, v4: bool = True, v6: bool = True, pod: str = "") -> Allocation:
    n = int(cid[-2:], 16)
    return Allocation(
        container_id=cid,
        namespace="default",
        pod=pod or f"p{n}",
        pod_uid="",
        if_name="eth0",
        netns=f"/run/netns/{cid}",
        ip6=ipaddress.IPv6Address(f"2001:db8:0:1::{n:x}") if v6 else None,
        ip4=ipaddress.IPv4Address(f"198.51.100.{n}") if v4 else None,
        port_mappings=mappings,
    )


@pytest.mark.parametrize(
    ("held", "asked", "clash"),
    [
        (PortMapping(80, 80), PortMapping(80, 81), True),
        (PortMapping(80, 80), PortMapping(80, 80, "udp"), False),
        (PortMapping(80, 80), PortMapping(81, 80), False),
        (PortMapping(80, 80), PortMapping(80, 80, "tcp", ip("192.0.2.1")), True),  # any address holds every one
        (PortMapping(80, 80, "tcp", ip("192.0.2.1")), PortMapping(80, 80, "tcp", ip("192.0.2.2")), False),
        (PortMapping(80, 80, "tcp", ip("192.0.2.1")), PortMapping(80, 80, "tcp", ip("192.0.2.1")), True),
        (PortMapping(80, 80, "tcp", ip("0.0.0.0")), PortMapping(80, 80, "tcp", ip("192.0.2.1")), True),
        (PortMapping(80, 80, "tcp", ip("0.0.0.0")), PortMapping(80, 80, "tcp", ip("2001:db8::1")), False),
        (PortMapping(80, 80, "tcp", ip("::")), PortMapping(80, 80, "tcp", ip("0.0.0.0")), False),
        (PortMapping(80, 80, "tcp", ip("::")), PortMapping(80, 80, "tcp", ip("2001:db8::1")), True),
        (PortMapping(80, 80, "tcp", ip("192.0.2.1")), PortMapping(80, 80, "tcp", ip("2001:db8::1")), False),
    ],
)
def test_claims_clash_when_the_same_packets_would_match(held: PortMapping, asked: PortMapping, clash: bool) -> None:
    claims = HostPortClaims()
    claims.claim(alloc("c0ffee01", held))
    if clash:
        with pytest.raises(HostPortInUse, match="held by pod default/p1"):
            claims.claim(alloc("c0ffee02", asked))
        claims.release("c0ffee01")
    claims.claim(alloc("c0ffee02", asked))
    assert len(claims) == 2 - clash


def test_families_decide_a_clash_and_a_hostip_needs_an_address_of_its_family() -> None:
    claims = HostPortClaims()
    claims.claim(alloc("c0ffee01", PortMapping(80, 80), v4=False))  # IPv6 only: holds 80/tcp on IPv6
    claims.claim(alloc("c0ffee02", PortMapping(80, 80), v6=False))  # IPv4 only: no clash
    with pytest.raises(HostPortInUse, match=r"\(IPv6\)"):
        claims.claim(alloc("c0ffee03", PortMapping(80, 80)))
    with pytest.raises(InvalidNetworkConfig, match="no IPv4 address"):
        claims.claim(alloc("c0ffee04", PortMapping(81, 80, "tcp", ip("192.0.2.1")), v4=False))
    # a claim is all or nothing, and a container re-claiming its own ports is no clash
    claims.claim(alloc("c0ffee01", PortMapping(80, 80), v4=False))
    assert len(claims) == 2


def test_claims_rebuilt_keep_the_first_holder_and_report_the_rest() -> None:
    first, second = alloc("c0ffee01", PortMapping(80, 80)), alloc("c0ffee02", PortMapping(80, 81))
    claims, clashes = HostPortClaims.of([first, second, alloc("c0ffee03", PortMapping(81, 80))])
    assert [(a.container_id, "held by pod default/p1" in why) for a, why in clashes] == [("c0ffee02", True)]
    assert len(claims) == 2


def test_a_mapping_becomes_one_dnat_per_family_of_the_pod() -> None:
    a = alloc("c0ffee01", PortMapping(80, 8080), PortMapping(53, 53, "udp", ip("0.0.0.0")))
    assert hostports_of(a) == (
        HostPort(80, Protocol.TCP, ip("2001:db8:0:1::1"), 8080),
        HostPort(80, Protocol.TCP, ip("198.51.100.1"), 8080),
        HostPort(53, Protocol.UDP, ip("198.51.100.1"), 53),  # 0.0.0.0: any IPv4 address
    )
    b = alloc("c0ffee02", PortMapping(80, 80, "sctp", ip("2001:db8::1")))
    assert hostports_of(b) == (HostPort(80, Protocol.SCTP, ip("2001:db8:0:1::2"), 80, ip("2001:db8::1")),)


# -- the handler -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def handler_running(api: ObjectStore, rows: MemoryAllocations | None = None):
    source = StoreSource(api, PODS, f"spec.nodeName={NODE}")
    watcher = PodWatcher(source, NODE)
    kernel = MemoryKernel()
    rows = MemoryAllocations() if rows is None else rows
    handler = await serving_handler(watcher, NODE_CONFIG, rows=rows, kernel=kernel)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        yield handler, kernel, rows
        nursery.cancel_scope.cancel()


def _api(*names: str) -> ObjectStore:
    api = ObjectStore()
    for name in names:
        api.create(PODS, pod_object("default", name, NODE, annotations={A + "ipv4": "true"}))
    return api


async def test_add_stores_mappings_and_network_and_refuses_a_taken_port(autojump_clock) -> None:
    with trio.fail_after(10):
        async with handler_running(_api("a", "b", "c")) as (handler, kernel, rows):
            await handler(request("ADD", cid="c0ffee0a", pod="a", **ports(m(8080, 80), m(8080, 80))))
            row = rows.rows["c0ffee0a"]
            assert row.port_mappings == (PortMapping(8080, 80),) and row.network == "flock-net"
            await handler(request("ADD", cid="c0ffee0c", pod="c", **ports(m(53, 53, "udp"), m(80, 80))))
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD", cid="c0ffee0b", pod="b", **ports(m(8080, 81, "TCP", "198.51.100.20"))))
            assert info.value.code == HOST_PORT_IN_USE == 111
            assert info.value.details == (
                "runtimeConfig.portMappings[0] 198.51.100.20:8080/tcp → 81 (IPv4): 8080/tcp → 80 is held by "
                "pod default/a (container c0ffee0a)"
            )
            # nothing taken: no row, no address, no veth
            assert (
                set(rows.rows)
                == set(kernel.veths)
                == set(handler.ipam.allocator.containers())
                == {"c0ffee0a", "c0ffee0c"}
            )
            # DEL gives the port back
            await handler(request("DEL", cid="c0ffee0a", pod="a"))
            await handler(request("ADD", cid="c0ffee0b", pod="b", **ports(m(8080, 81))))
            assert rows.rows["c0ffee0b"].state is AllocationState.COMMITTED


async def test_two_adds_racing_for_one_port_one_wins(autojump_clock) -> None:
    with trio.fail_after(10):
        async with handler_running(_api("a", "b")) as (handler, kernel, rows):
            kernel.gate = trio.Event()  # both ADDs stop in the kernel setup, after their claims
            outcomes: dict[str, object] = {}

            async def add(name: str) -> None:
                try:
                    outcomes[name] = await handler(request("ADD", cid=f"c0ffee0{name}", pod=name, **ports(m(80))))
                except errors.CniError as exc:
                    outcomes[name] = exc.code

            async with trio.open_nursery() as nursery:
                nursery.start_soon(add, "a")
                nursery.start_soon(add, "b")
                await trio.sleep(1)
                kernel.gate.set()
            assert sorted(isinstance(v, dict) for v in outcomes.values()) == [False, True]
            assert HOST_PORT_IN_USE in outcomes.values() and len(rows.rows) == 1


async def test_claims_come_back_from_the_store_and_gc_is_scoped_to_its_network(autojump_clock) -> None:
    rows = MemoryAllocations()
    with trio.fail_after(10):
        async with handler_running(_api("a", "b", "c"), rows) as (handler, _kernel, _rows):
            await handler(request("ADD", cid="c0ffee0a", pod="a", **ports(m(80))))
            await handler(request("ADD", cid="c0ffee0b", pod="b", name="podman", **ports(m(81))))
        # a restarted handler over the same rows: the claims are rebuilt
        async with handler_running(_api("a", "b", "c"), rows) as (handler, _kernel, _rows):
            for port in (80, 81):
                with pytest.raises(errors.CniError) as info:
                    await handler(request("ADD", cid="c0ffee0c", pod="c", **ports(m(port))))
                assert info.value.code == HOST_PORT_IN_USE
            # GC for flock-net removes its own unlisted attachment only; podman's stays
            await handler(request("GC", **{"cni.dev/valid-attachments": []}))
            assert {r.container_id: r.network for r in rows.rows.values()} == {"c0ffee0b": "podman"}
            await handler(request("ADD", cid="c0ffee0c", pod="c", **ports(m(80))))
            with pytest.raises(errors.CniError) as info:
                await handler(request("GC", name="bad name", **{"cni.dev/valid-attachments": []}))
            assert info.value.code == errors.INVALID_CONFIG and info.value.details.startswith("name='bad name'")
            await handler(request("GC", name="podman", **{"cni.dev/valid-attachments": []}))
            assert set(rows.rows) == {"c0ffee0c"}


async def test_a_repeated_add_must_ask_for_what_the_first_got(autojump_clock) -> None:
    with trio.fail_after(10):
        async with handler_running(_api("a", "b")) as (handler, _kernel, rows):
            first = await handler(request("ADD", cid="c0ffee0a", pod="a", **ports(m(8080, 80))))
            assert await handler(request("ADD", cid="c0ffee0a", pod="a", **ports(m(8080, 80)))) == first
            for config, field in (
                (ports(m(9090, 80)), "runtimeConfig.portMappings"),
                ({}, "runtimeConfig.portMappings"),
            ):
                with pytest.raises(errors.CniError) as info:
                    await handler(request("ADD", cid="c0ffee0a", pod="a", **config))
                assert info.value.code == errors.INVALID_ENV and info.value.details.startswith(field), info.value
            # 9090 was never taken
            await handler(request("ADD", cid="c0ffee0b", pod="b", **ports(m(9090, 80))))
            assert rows.rows["c0ffee0a"].port_mappings == (PortMapping(8080, 80),)


async def test_gc_for_a_named_network_leaves_rows_of_unknown_network_alone(autojump_clock) -> None:
    """A podman container stored before flock recorded networks: its network cannot be told."""
    rows = MemoryAllocations()
    podman = Allocation(
        container_id="c0ffee0e", namespace="", pod="box", pod_uid="", if_name="eth0", netns="/run/netns/box",
        ip6=ipaddress.IPv6Address("2001:db8:0:1::e"), state=AllocationState.COMMITTED, network="",
    )  # fmt: skip
    rows.rows[podman.container_id] = podman
    with trio.fail_after(10):
        async with handler_running(_api(), rows) as (handler, _kernel, _rows):
            await handler(request("GC", **{"cni.dev/valid-attachments": []}))
            await handler(request("GC", name="podman", **{"cni.dev/valid-attachments": []}))
            assert set(rows.rows) == {"c0ffee0e"}
            await handler(request("DEL", cid="c0ffee0e", pod="box"))  # its runtime's DEL still removes it
            assert rows.rows == {}


async def test_ports_clashing_at_rebuild_are_neither_claimed_nor_mapped(autojump_clock) -> None:
    rows = MemoryAllocations()
    holder = attrs.evolve(alloc("c0ffee01", PortMapping(80, 80)), state=AllocationState.COMMITTED)
    loser = alloc("c0ffee02", PortMapping(80, 81))  # pending: the committed row keeps the port
    rows.rows.update({a.container_id: a for a in (loser, holder)})
    with trio.fail_after(10):
        async with handler_running(_api("p1", "p2"), rows) as (handler, _kernel, _rows):
            view = handler.state.allocations
            assert view["c0ffee01"].port_mappings == (PortMapping(80, 80),) and view["c0ffee02"].port_mappings == ()
            assert rows.rows["c0ffee02"].port_mappings == (PortMapping(80, 81),)  # the row keeps them
