"""Batched rtnetlink requests against the real kernel, in namespaces these tests create."""

import errno
import ipaddress
import os

import pytest
from pyroute2.netlink.exceptions import NetlinkError

from flock.netlink import _apply, _batch, _build, _nsenter
from flock.netlink.desired import Address, Nexthop, Route, Scope, Side
from flock.testing.netns import netns_pool

pytestmark = pytest.mark.usefixtures("require_root")
ip = ipaddress.ip_address


@pytest.fixture
def ns():
    with netns_pool("fl-nlb-") as pool:
        a, b = pool.create("a"), pool.create("b")
        pool.veth(a, "v0", b, "v1")
        yield a


def test_every_message_is_answered_in_order_and_a_refusal_does_not_stop_the_rest(ns):
    with _batch.RtnlSocket.open_in(ns.path) as sock:
        (link,) = sock.one(_build.get_link("v0"))
        index = link["index"]
        replies = sock.request(
            [
                _build.set_link(index, up=True),
                _build.new_address(Address(Side.HOST, "v0", ip("2001:db8::1"), 64), index),
                _build.new_address(Address(Side.HOST, "v0", ip("2001:db8::2"), 64), 999_999),  # no such link
                _build.replace_route(
                    Route(Side.HOST, ipaddress.ip_network("2001:db8:1::/64"), (Nexthop("v0"),), Scope.UNIVERSE), index
                ),
            ]
        )
        assert [r.error.code if r.error else None for r in replies] == [None, None, errno.ENODEV, None]
        with pytest.raises(NetlinkError) as refused:
            replies[2].unwrap()
        assert refused.value.code == errno.ENODEV and "add address 2001:db8::2/64 to link #999999" in str(refused.value)
        assert replies[2].unwrap(errno.ENODEV) == []
        # The last message refused: its error ends the batch too.
        (last,) = sock.request([_build.set_link(999_999, up=True)])
        assert last.error is not None and last.error.code == errno.ENODEV
        # GET answers arrive with their request's reply, acks or not.
        got = sock.request([_build.get_link("lo"), _build.get_link("v0")])
        assert [m.get("IFLA_IFNAME") for r in got for m in r.unwrap()] == ["lo", "v0"]
    assert "2001:db8::1/64" in ns.ip("-6", "addr", "show", "dev", "v0")
    assert "2001:db8::2" not in ns.ip("-6", "addr")
    assert "2001:db8:1::/64 dev v0 proto 70" in ns.ip("-6", "route")
    assert "UP" in ns.ip("link", "show", "v0").split(">")[0]


def test_a_socket_made_elsewhere_works_in_its_own_namespace(ns):
    helper = _nsenter.NetnsThread()
    with _batch.RtnlSocket.open_in(ns.path, helper.run) as sock:
        assert sock.one(_build.get_link("v0"))[0].get("IFLA_IFNAME") == "v0"
    with _batch.RtnlSocket() as sock:  # this thread's namespace has no v0
        assert sock.request([_build.get_link("v0")])[0].error.code == errno.ENODEV


def test_set_link_refuses_up_with_addrgenmode_in_one_message():
    # The kernel applies flags before IFLA_AF_SPEC: the link would be up with its own link-local first.
    with pytest.raises(ValueError, match="addrgenmode"):
        _build.set_link(1, up=True, addrgenmode_none=True)


def test_a_created_veth_is_echoed_before_the_ack_and_read_when_it_is_not():
    with netns_pool("fl-nlb-") as pool:
        node, pod = pool.create("node"), pool.create("pod")
        fd = _nsenter.open_netns(pod.path)
        try:
            with _batch.RtnlSocket.open_in(node.path) as sock:
                (created,) = sock.request([_build.new_veth("fl0", "eth0", fd, None)])
                assert created.error is None
                # Kernel 6.18 echoes the new host end (NLM_F_ECHO); the ack after it was read too.
                (echo,) = created.msgs
                assert _apply.created_link(sock, created, "fl0") is echo
                assert echo.get_attr("IFLA_LINK") and echo.get_attr("IFLA_ADDRESS") in node.ip("link", "show", "fl0")
                # A kernel that echoes nothing: the link is read instead.
                read = _apply.created_link(sock, _batch.Reply(), "fl0")
                assert read is not echo and read["index"] == echo["index"]
                # Nothing of the creation is left unread to confuse the next request.
                (again,) = sock.request([_build.new_veth("fl0", "eth0", fd, None)])
                assert again.error is not None and again.error.code == errno.EEXIST and again.msgs == []
                assert [m.get_attr("IFLA_IFNAME") for m in sock.one(_build.get_link("lo"))] == ["lo"]
        finally:
            os.close(fd)
