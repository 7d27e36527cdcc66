"""``wg set`` arguments from the device's state and the desired one (pure), and ``wg show dump`` read back."""

from __future__ import annotations

import ipaddress

import pytest

from flock.wireguard import Change, DeviceState, Endpoint, Peer, PeerState, PrivateKey, Tools, plan_set

net = ipaddress.ip_network
ME = PrivateKey.generate()
K = sorted(PrivateKey.generate().public_key for _ in range(4))
EP = Endpoint(ipaddress.ip_address("2001:db8::2"), 51820)


def state(*peers: PeerState, key: PrivateKey | None = ME, port: int = 51820) -> DeviceState:
    return DeviceState(key.public_key if key else None, port, {p.public_key: p for p in peers})


def have(i: int, *blocks: str, keepalive: int | None = 25, handshake: int | None = 1700000000) -> PeerState:
    return PeerState(K[i], EP, frozenset(net(b) for b in blocks), keepalive, handshake, 10, 20)


def want(i: int, *blocks: str, keepalive: int | None = 25, endpoint: Endpoint | None = EP) -> Peer:
    return Peer(K[i], endpoint, frozenset(net(b) for b in blocks), keepalive)


def test_unchanged_is_no_call() -> None:
    current = state(have(0, "2001:db8:2::/64", "198.51.100.0/25"), have(1, "2001:db8:3::/64"))
    args, change = plan_set(current, ME.public_key, 51820, [current.peers[K[1]].configured()])
    assert K[0] in change.removed and args == ["peer", str(K[0]), "remove"]
    args, change = plan_set(
        current, ME.public_key, 51820, [want(0, "198.51.100.0/25", "2001:db8:2::/64"), want(1, "2001:db8:3::/64")]
    )
    assert args == [] and not change and change == Change()


def test_only_what_differs_in_place() -> None:
    current = state(have(0, "2001:db8:2::/64"), have(1, "2001:db8:3::/64"))
    other = Endpoint(ipaddress.ip_address("192.0.2.9"), 51820)
    args, change = plan_set(
        current,
        ME.public_key,
        51820,
        [want(0, "2001:db8:2::/64", "198.51.100.0/25"), want(1, "2001:db8:3::/64", keepalive=None, endpoint=other)],
    )
    assert change.updated == (K[0], K[1]) and not change.added and not change.removed and not change.key_set
    assert args == [
        "peer",
        str(K[0]),
        "allowed-ips",
        "198.51.100.0/25,2001:db8:2::/64",
        "peer",
        str(K[1]),
        "endpoint",
        "192.0.2.9:51820",
        "persistent-keepalive",
        "off",
    ]
    # no endpoint desired: the one there is kept
    args, _ = plan_set(
        current, ME.public_key, 51820, [want(0, "2001:db8:2::/64", endpoint=None), want(1, "2001:db8:3::/64")]
    )
    assert args == []


def test_a_key_change_moves_the_blocks_within_one_call_removal_first() -> None:
    current = state(have(0, "2001:db8:2::/64"))
    args, change = plan_set(current, ME.public_key, 51820, [want(3, "2001:db8:2::/64")])
    assert change.removed == (K[0],) and change.added == (K[3],)
    assert args == [
        "peer",
        str(K[0]),
        "remove",
        "peer",
        str(K[3]),
        "endpoint",
        "[2001:db8::2]:51820",
        "allowed-ips",
        "2001:db8:2::/64",
        "persistent-keepalive",
        "25",
    ]


def test_key_and_port() -> None:
    other = PrivateKey.generate()
    args, change = plan_set(state(key=None, port=0), other.public_key, 51820, [])
    assert change.key_set and change.port_set and args == ["listen-port", "51820"]
    args, change = plan_set(state(), other.public_key, 51820, [])
    assert change.key_set and not change.port_set and args == []
    with pytest.raises(ValueError, match="twice"):
        plan_set(state(), ME.public_key, 1, [want(0), want(0, "2001:db8::/64")])


def test_dump_read_back_without_the_private_key() -> None:
    peer = PrivateKey.generate().public_key
    dump = (
        f"{ME.reveal_base64()}\t{ME.public_key}\t51820\toff\n"
        f"{peer}\t(none)\t[2001:db8::2]:51820\t2001:db8:2::/64,198.51.100.128/25\t1700000001\t1184\t1056\t25\n"
        f"{K[0]}\t(none)\t(none)\t(none)\t0\t0\t0\toff\n"
    )
    got = DeviceState.from_dump(dump)
    assert got.public_key == ME.public_key and got.listen_port == 51820
    assert got.peers[peer] == PeerState(
        peer, EP, frozenset({net("2001:db8:2::/64"), net("198.51.100.128/25")}), 25, 1700000001, 1184, 1056
    )
    assert got.peers[K[0]] == PeerState(K[0], None, frozenset(), None, None, 0, 0)
    assert ME.reveal_base64() not in repr(got)
    assert DeviceState.from_dump("(none)\t(none)\t0\toff\n") == DeviceState(None, 0, {})
    with pytest.raises(ValueError, match="fields"):
        DeviceState.from_dump("a\tb\n")


def test_missing_tools_are_named_with_their_package() -> None:
    missing = Tools(wg="/nonexistent/wg", wireguard_go="/nonexistent/wireguard-go").missing()
    assert missing == [
        "/nonexistent/wg (Debian package wireguard-tools)",
        "/nonexistent/wireguard-go (Debian package wireguard-go)",
    ]
