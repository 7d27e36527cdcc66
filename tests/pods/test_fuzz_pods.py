"""Property tests: the pod handler over the in-memory store and kernel
(flock/testing/pods.py) with random annotations, CNI_ARGS, prevResults,
valid-attachments and random interleavings of ADD/DEL/CHECK/GC.

Invariants: an ADD succeeds with addresses inside its effective CIDRs or
fails with a CniError naming what was wrong; a failed op leaves no row, no
kernel state and no held address behind; DEL restores the start; the store,
the handler's allocations and the IPAM's holdings always agree and no
address is held twice."""

from __future__ import annotations

import attrs
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flock import errors
from flock.apiserver import nodeconfig_object, pod_object
from flock.ipam import AnnotationError, parse_request
from flock.model import AllocationState, NodeConfig, PodInfo
from flock.pods import ADDRESS_EXHAUSTED, CHECK_FAILED, PodHandler
from flock.rpc import Request
from flock.testing.pods import CONFIG, MemoryAllocations, MemoryKernel, serving_handler

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NODE_NAME = "host001"
NODE = NodeConfig.from_object(
    nodeconfig_object(
        NODE_NAME,
        "2001:db8:0:1::/120",
        cidr4="198.51.100.0/29",
        families={"ipv6": True, "ipv4": True},
        announceRanges=["2001:db8:8000::/33", "203.0.113.0/24"],
    )
)
A = "flock.fritzlab.net/"
VALUES = {
    "ipv6": ("true", "false", "TRUE", "yes", ""),
    "ipv4": ("true", "false", " false ", "0"),
    "cidr6": (
        "2001:db8:0:1::/120",
        "2001:db8:0:1::80/121",
        "2001:db8::/32",
        "2001:db8:0:2::/64",
        "198.51.100.0/30",
        "2001:db8:0:1::/120,",
        "2001:db8:0:1::80%eth0/121",
        "2001:db8:0:1::81/121",
        "2001:db8:0:1::/128",
    ),
    "cidr4": (
        "198.51.100.0/29",
        "198.51.100.4/30",
        "198.51.100.0/31",
        "203.0.113.0/24",
        "198.051.100.0/29",
        "2001:db8::/64",
        "198.51.100.0/30, 198.51.100.4/30",
    ),
    "ip-algo": ("random:4", "n:3", "pod:2,n:2", "namespace:64,random:64", "random:１", "random:0", "bogus:1", "pod:4"),
    "anycast": (
        "203.0.113.10",
        "2001:db8:ffff::10",
        "198.51.100.2",
        "2001:db8:0:1::5",
        "2001:db8:ffff::10%eth0",
        "::ffff:203.0.113.10",
        "fe80::1",
        "203.0.113.10,",
        "8.8.8.8",  # outside the blocks and announceRanges
        "255.255.255.255",
        ",".join(f"2001:db8:aaaa::{i:x}" for i in range(5000)),  # over the 64-per-pod limit
    ),
    "addresses": (
        "203.0.113.20",
        "2001:db8:ffff::20",
        "2001:DB8:FFFF::21",
        "010.0.0.1",
        "203.0.113.10",
        "2001:db8:0:1::",
        "198.51.100.7",
        " 203.0.113.21 ",
        "198.51.100.2",
        "198.51.100.3,2001:db8:0:1::6",
    ),
}
NAMES = ("web-0", "web-1", "db-0")


@st.composite
def annotations(draw):
    """Mostly the values above (valid, invalid and tricky), one in ten arbitrary text."""
    keys = draw(st.lists(st.sampled_from(sorted(VALUES)), unique=True, max_size=3))
    value = lambda k: st.integers(0, 9).flatmap(lambda i: st.text(max_size=8) if i == 0 else st.sampled_from(VALUES[k]))  # noqa: E731
    return {A + k: draw(value(k)) for k in keys}


cni_args = st.one_of(
    st.sampled_from(NAMES).map(lambda n: f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={n}"),
    st.sampled_from(NAMES).map(
        lambda n: f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={n};K8S_POD_UID=uid-{n}"
    ),
    st.sampled_from(
        [
            "",
            "K8S_POD_NAME=web-0",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=Web_0",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=ghost",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=other",
            "K8S_POD_NAMESPACE=../x;K8S_POD_NAME=web-0",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=é",
        ]
    ),
    st.text(max_size=30),
)


@attrs.define(eq=False)
class DictPods:
    """The pod informer's cache reduced to what the handler asks of it."""

    pods: dict[tuple[str, str], PodInfo] = attrs.field(factory=dict)

    async def lookup(self, namespace: str, name: str) -> PodInfo | None:
        await trio.lowlevel.checkpoint()
        return self.pods.get((namespace, name))

    async def fetch_pod(self, namespace: str, name: str) -> PodInfo | None:
        return await self.lookup(namespace, name)


def make_pods(ann_by_name: dict[str, dict[str, str]]) -> DictPods:
    pods = DictPods()
    for name, ann in ann_by_name.items():
        obj = pod_object("default", name, NODE_NAME, annotations=ann)
        obj["metadata"]["uid"] = f"uid-{name}"
        pods.pods[("default", name)] = PodInfo.from_object(obj)
    return pods


async def new_handler(pods: DictPods) -> tuple[PodHandler, MemoryAllocations, MemoryKernel]:
    rows, kernel = MemoryAllocations(), MemoryKernel()
    handler = await serving_handler(pods, NODE, rows=rows, kernel=kernel, seed=7)
    return handler, rows, kernel


def request(op: str, cid: str, args: str, **config) -> Request:
    return Request(
        op, container_id=cid, netns=f"/run/netns/{cid}", if_name="eth0", args=args, config={**CONFIG, **config}
    )


def snapshot(handler: PodHandler, rows: MemoryAllocations, kernel: MemoryKernel):
    ipam = handler.ipam
    return (
        dict(rows.rows),
        dict(kernel.veths),
        dict(handler.state.allocations),
        ipam.allocator.in_use(),
        {c: ipam.allocator.held(c) for c in ipam.allocator.containers()},
    )


def assert_consistent(handler: PodHandler, rows: MemoryAllocations, kernel: MemoryKernel) -> None:
    ipam = handler.ipam
    assert set(rows.rows) == set(handler.state.allocations) == set(ipam.allocator.containers())
    assert set(kernel.veths) <= set(rows.rows)
    seen = {}
    for cid, alloc in rows.rows.items():
        assert handler.state.allocations[cid] == alloc
        held = ipam.allocator.held(cid)
        assert (held.ip6, held.ip4, held.anycast, held.addresses) == (
            alloc.ip6,
            alloc.ip4,
            alloc.anycast,
            alloc.addresses,
        )
        for addr in alloc.all_addresses:
            assert "%" not in str(addr), f"{cid} holds {addr!r} with a scope ID"
        for addr in (alloc.ip6, alloc.ip4, *alloc.addresses):
            if addr is not None:
                assert addr not in seen, f"{addr} held by {seen[addr]} and {cid}"
                seen[addr] = cid
    assert ipam.allocator.in_use() == len(seen)
    shared = {a for alloc in rows.rows.values() for a in alloc.anycast}
    assert not shared & set(seen), f"anycast {shared & set(seen)} also held exclusively"


def assert_named(err: errors.CniError, ann: dict[str, str], args: str) -> None:
    """The error says which input was wrong."""
    cause = err.__cause__
    if isinstance(cause, AnnotationError):
        assert err.code == errors.INVALID_CONFIG and cause.annotation.startswith(A)
        # long values are quoted by their head (errors.quote) and long details cut in the middle
        assert err.details.startswith(f"{cause.annotation}={cause.value!r}"[:80])
        assert cause.annotation in ann or cause.annotation in (A + "ipv6", A + "ipv4", A + "cidr4")
        if cause.annotation in ann and cause.annotation not in (A + "addresses", A + "anycast"):
            assert cause.value == ann[cause.annotation]
    elif err.code == ADDRESS_EXHAUSTED:
        assert err.msg.startswith("no free IPv")
    elif err.code == errors.INVALID_ENV:
        assert "K8S_POD_" in err.details or "containerID=" in err.details or "ifName=" in err.details
    else:
        assert err.code == errors.TRY_AGAIN_LATER and ("pod " in err.details or "K8S_POD_UID" in err.details), err


def run(fn, *args):
    async def main():
        with trio.fail_after(10):
            return await fn(*args)

    return trio.run(main)


KERNEL_FAILURE = errors.CniError(errors.IO_ERROR, "netlink veth failed", "injected by the test")


@FUZZ
@given(annotations(), cni_args, st.integers(0, 5).map(lambda i: i == 0))
def test_add_succeeds_inside_the_effective_cidrs_or_fails_cleanly(ann, args, kernel_fails):
    async def scenario():
        handler, rows, kernel = await new_handler(make_pods({"web-0": ann, "web-1": {}}))
        await handler(request("ADD", "keep0001", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1"))
        before = snapshot(handler, rows, kernel)
        kernel.fail_with = KERNEL_FAILURE if kernel_fails else None
        try:
            result = await handler(request("ADD", "c0ffee01", args))
        except errors.CniError as err:
            event(f"ADD failed with code {err.code}")
            if err is not KERNEL_FAILURE:
                assert_named(err, ann, args)
            assert snapshot(handler, rows, kernel) == before
            return
        event("ADD succeeded")
        alloc = rows.rows["c0ffee01"]
        assert alloc.state is AllocationState.COMMITTED and "c0ffee01" in kernel.veths
        # A container without a pod (no K8S_POD_NAMESPACE) gets the NodeConfig's defaults.
        pod_ann = handler.pods.pods[(alloc.namespace, alloc.pod)].annotations if alloc.namespace else {}
        want = parse_request(pod_ann, NODE, handler.ipam.default_layout)
        assert (alloc.ip6 is None) == (want.cidr6 is None) and (alloc.ip4 is None) == (want.cidr4 is None)
        assert alloc.ip6 is None or (alloc.ip6 in want.cidr6 and alloc.ip6 != want.cidr6.network_address)
        assert alloc.ip4 is None or alloc.ip4 in want.cidr4
        assert (alloc.anycast, alloc.addresses) == (want.anycast, want.addresses)
        assert {ip["address"].split("/")[0] for ip in result["ips"]} == {
            str(a) for a in (alloc.ip6, alloc.ip4, *alloc.addresses) if a is not None
        }
        assert_consistent(handler, rows, kernel)
        await handler(request("DEL", "c0ffee01", args))
        assert snapshot(handler, rows, kernel) == before

    run(scenario)


prev_results = st.one_of(
    st.just("exact"),
    st.just("swap-family"),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.text(max_size=12)
        | st.sampled_from(["2001:db8:0:1::5/128", "2001:db8::5%eth0/128", "198.51.100.2/32", "::/0", "x/y"]),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["ips", "address", "x"]), inner, max_size=2)
        ),
        max_leaves=6,
    ),
)


@FUZZ
@given(prev_results)
def test_check_with_any_prev_result_answers_or_names_the_field(prev):
    async def scenario():
        handler, rows, kernel = await new_handler(make_pods({"web-0": {A + "ipv4": "true"}}))
        args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"
        result = await handler(request("ADD", "c0ffee01", args))
        before = snapshot(handler, rows, kernel)
        if prev == "exact":
            value = result
        elif prev == "swap-family":
            value = {**result, "ips": result["ips"][:1]}
        else:
            value = prev
        try:
            out = await handler(request("CHECK", "c0ffee01", args, prevResult=value))
        except errors.CniError as err:
            assert err.code in (errors.INVALID_CONFIG, CHECK_FAILED), err
            assert "prevResult" in err.details or "prevResult" in err.msg
            assert prev != "exact"
        else:
            assert out == {} and prev == "exact"
        assert snapshot(handler, rows, kernel) == before  # CHECK changes nothing

    run(scenario)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["containerID", "ifname", "x"]), inner, max_size=2)
    ),
    max_leaves=6,
)
attachments = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {
                "containerID": st.sampled_from(["c0ffee01", "c0ffee02", "nope"]),
                "ifname": st.sampled_from(["eth0", "net1"]),
            }
        ),
        max_size=3,
    ),
    json_values,
)


@FUZZ
@given(attachments)
def test_gc_keeps_exactly_the_valid_attachments_or_names_the_field(valid):
    async def scenario():
        handler, rows, kernel = await new_handler(make_pods({"web-0": {}, "web-1": {A + "anycast": "203.0.113.10"}}))
        await handler(request("ADD", "c0ffee01", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"))
        await handler(request("ADD", "c0ffee02", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1"))
        before = snapshot(handler, rows, kernel)
        try:
            await handler(request("GC", "", "", **{"cni.dev/valid-attachments": valid}))
        except errors.CniError as err:
            assert err.code == errors.INVALID_CONFIG and "cni.dev/valid-attachments" in err.details
            assert snapshot(handler, rows, kernel) == before
            return
        kept = {v["containerID"] for v in valid if v["ifname"] == "eth0"} & {"c0ffee01", "c0ffee02"}
        assert set(rows.rows) == kept
        assert_consistent(handler, rows, kernel)

    run(scenario)


CIDS = ("c0ffee01", "c0ffee02", "c0ffee03")
op_step = st.tuples(
    st.sampled_from(("ADD", "ADD", "DEL", "CHECK", "GC")),
    st.sampled_from(CIDS),
    st.sampled_from(NAMES),
    st.sampled_from(("eth0", "eth0", "net1")),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(NAMES), annotations(), max_size=3),
    st.lists(st.tuples(st.lists(op_step, min_size=1, max_size=3), st.integers(0, 4).map(lambda i: i == 0)), max_size=8),
)
def test_random_interleavings_keep_store_handler_and_ipam_in_agreement(ann_by_name, batches):
    async def scenario():
        pods = make_pods({name: ann_by_name.get(name, {}) for name in NAMES})
        handler, rows, kernel = await new_handler(pods)
        start = snapshot(handler, rows, kernel)

        async def one(op, cid, name, if_name):
            config = {}
            if op == "CHECK":
                alloc = rows.rows.get(cid)
                config["prevResult"] = (
                    {
                        "ips": [
                            {"address": f"{a}/{a.max_prefixlen}"}
                            for a in (alloc.ip6, alloc.ip4, *alloc.addresses)
                            if a is not None
                        ]
                    }
                    if alloc
                    else {}
                )
            if op == "GC":
                config["cni.dev/valid-attachments"] = [{"containerID": c, "ifname": "eth0"} for c in CIDS if c != cid]
            r = Request(
                op,
                container_id=cid,
                netns=f"/run/netns/{cid}",
                if_name=if_name,
                args=f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}",
                config={**CONFIG, **config},
            )
            try:
                await handler(r)
                event(f"{op} ok")
            except errors.CniError as err:
                event(f"{op} code {err.code}")
                assert err.code != errors.INTERNAL, err
                if op == "ADD" and err is not KERNEL_FAILURE:
                    assert_named(err, pods.pods[("default", name)].annotations, r.args)

        for batch, kernel_fails in batches:
            kernel.fail_with = KERNEL_FAILURE if kernel_fails else None
            async with trio.open_nursery() as nursery:
                for step in batch:
                    nursery.start_soon(one, *step)
            assert_consistent(handler, rows, kernel)
            assert all(a.state is AllocationState.COMMITTED for a in rows.rows.values())
        kernel.fail_with = None
        for cid in CIDS:
            alloc = rows.rows.get(cid)
            await handler(
                Request("DEL", container_id=cid, if_name=alloc.if_name if alloc else "eth0", config=dict(CONFIG))
            )
        assert snapshot(handler, rows, kernel) == start

    run(scenario)


def test_non_ascii_pod_uid_is_code_4_not_try_again():
    # Regression: str.isalnum() let 'é' through, so the ADD failed with code 11
    # ("pod UID differs") and the runtime retried it forever.
    async def scenario():
        handler, rows, _kernel = await new_handler(make_pods({"web-0": {}}))
        try:
            await handler(request("ADD", "c0ffee01", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=é"))
        except errors.CniError as err:
            return err, dict(rows.rows)
        raise AssertionError("ADD succeeded")

    err, stored = run(scenario)
    assert (err.code, err.details) == (
        errors.INVALID_ENV,
        "K8S_POD_UID='é': expected a UID such as 6f1c2a9e-0d4b-4f6e-9a51-3c2d1e0f9b8a",
    )
    assert stored == {}
