"""The pod handler in virtual time: ADD vs the pod informer, the 25 s deadline,
per-container serialization, bad input, DEL/CHECK/STATUS/GC semantics."""

from __future__ import annotations

import contextlib
import ipaddress
import logging

import attrs
import pytest
import trio

from flock import errors
from flock.apiserver import PODS, ObjectStore, nodeconfig_object, pod_object
from flock.model import Allocation, AllocationState, NodeConfig
from flock.pods import ADD_DEADLINE_S, ADDRESS_EXHAUSTED, CHECK_FAILED, KeyedLocks, PodHandler
from flock.rpc import Request
from flock.testing import StoreSource
from flock.testing.pods import MemoryAllocations, MemoryKernel, fake_macs, request, serving_handler
from flock.watchers import PodWatcher

NODE = "host001"
NODE_CONFIG = NodeConfig.from_object(
    nodeconfig_object(NODE, "2001:db8:0:1::/64", cidr4="198.51.100.0/29", families={"ipv6": True, "ipv4": True})
)
A = "flock.fritzlab.net/"


@contextlib.asynccontextmanager
async def handler_running(api: ObjectStore, *, ready: bool = True, rows: MemoryAllocations | None = None):
    source = StoreSource(api, PODS, f"spec.nodeName={NODE}")
    watcher = PodWatcher(source, NODE)
    kernel = MemoryKernel()
    rows = MemoryAllocations() if rows is None else rows
    handler = await serving_handler(watcher, NODE_CONFIG, rows=rows, kernel=kernel, ready=ready)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        yield handler, kernel, rows, source, handler.state
        nursery.cancel_scope.cancel()


def held(handler: PodHandler) -> set[str]:
    return set(handler.ipam.allocator.containers())


async def test_add_waits_for_the_informer_and_wakes_when_the_pod_arrives(autojump_clock):
    api = ObjectStore()
    with trio.fail_after(10):
        async with handler_running(api) as (handler, _kernel, rows, source, state):

            async def create_later():
                await trio.sleep(1.25)
                api.create(PODS, pod_object("default", "web-0", NODE, annotations={A + "ipv4": "false"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(create_later)
                result = await handler(request("ADD"))
            assert trio.current_time() == 1.25
            assert source.gets == []  # the watch delivered it: no direct GET
            assert [ip["address"].endswith("/128") for ip in result["ips"]] == [True]
            assert rows.rows["c0ffee01"].state is AllocationState.COMMITTED
            assert state.allocations == rows.rows  # the view BIRD and the metrics read


async def test_add_falls_back_to_one_direct_get_after_three_seconds(autojump_clock):
    api = ObjectStore()
    # Not (yet) bound to this node as far as the watch knows: only a GET finds it.
    api.create(PODS, pod_object("default", "web-0", "elsewhere"))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, _kernel, rows, source, _):
            result = await handler(request("ADD"))
            assert trio.current_time() == 3.0
            assert source.gets == [("default", "web-0")]
            assert len(result["ips"]) == 2
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD", cid="c0ffee02", pod="ghost"))
            assert info.value.code == errors.TRY_AGAIN_LATER and "default/ghost" in info.value.details
            assert trio.current_time() == 6.0 and "c0ffee02" not in rows.rows


async def test_add_past_its_deadline_is_code_11_and_stays_pending_for_the_retry(autojump_clock):
    api = ObjectStore()
    api.create(PODS, pod_object("default", "web-0", NODE))
    with trio.fail_after(100):
        async with handler_running(api) as (handler, kernel, rows, _, _):
            kernel.gate = trio.Event()
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD"))
            assert trio.current_time() == ADD_DEADLINE_S == 25.0
            assert info.value.code == errors.TRY_AGAIN_LATER and "25 s" in info.value.details
            pending = rows.rows["c0ffee01"]
            assert pending.state is AllocationState.PENDING and held(handler) == {"c0ffee01"}
            kernel.gate.set()
            result = await handler(request("ADD"))
            assert {ip["address"] for ip in result["ips"]} == {f"{pending.ip6}/128", f"{pending.ip4}/32"}
            assert rows.rows["c0ffee01"].state is AllocationState.COMMITTED
            assert handler.locks_in_use == 0


async def test_once_rebuilt_add_del_and_check_read_rows_from_the_view_and_left_out_rows_from_the_store(
    autojump_clock,
):
    """Every write goes to the store, then to the node's view: a new pod's ADD,
    its repeat, CHECK and DEL cost no store read.  A row the rebuild left out (it
    claims an address a committed row holds) is read from the store and removed."""
    api = ObjectStore()
    api.create(PODS, pod_object("default", "web-0", NODE))
    rows = MemoryAllocations()
    keeper = Allocation(
        container_id="c0ffee0a", namespace="default", pod="a", pod_uid="", if_name="eth0", netns="/run/netns/c0ffee0a",
        ip6=ipaddress.IPv6Address("2001:db8:0:1::a"), state=AllocationState.COMMITTED,
    )  # fmt: skip
    loser = attrs.evolve(
        keeper, container_id="c0ffee0b", pod="b", netns="/run/netns/c0ffee0b", state=AllocationState.PENDING
    )
    rows.rows.update({keeper.container_id: keeper, loser.container_id: loser})
    with trio.fail_after(10):
        async with handler_running(api, rows=rows) as (handler, _kernel, _rows, _source, state):
            assert set(state.allocations) == {"c0ffee0a"}
            first = await handler(request("ADD"))
            assert await handler(request("ADD")) == first
            await handler(request("CHECK", prevResult=first))
            await handler(request("DEL"))
            assert rows.gets == [] and "c0ffee01" not in rows.rows
            await handler(request("DEL", cid="c0ffee0b", pod="b"))
            assert rows.gets == ["c0ffee0b"] and set(rows.rows) == {"c0ffee0a"}
            await handler(request("DEL", cid="c0ffee0b", pod="b"))
            assert rows.gets == ["c0ffee0b"]  # gone from the store and the view: nothing to read
            assert held(handler) == {"c0ffee0a"}


async def test_one_container_at_a_time_different_containers_in_parallel(autojump_clock):
    api = ObjectStore()
    for name in ("a", "b"):
        api.create(PODS, pod_object("default", name, NODE))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, _rows, _, _):
            kernel.gate = trio.Event()
            results = {}

            async def add(key, cid, pod):
                results[key] = await handler(request("ADD", cid=cid, pod=pod))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(add, "first", "c0ffee0a", "a")
                nursery.start_soon(add, "again", "c0ffee0a", "a")
                nursery.start_soon(add, "other", "c0ffee0b", "b")
                await trio.sleep(1)
                # Container a's second ADD waits for the first; b's runs beside it.
                assert (kernel.setups, kernel.in_setup, handler.locks_in_use) == (2, 2, 2)
                kernel.gate.set()
            assert results["first"] == results["again"] != results["other"]
            assert kernel.setups == 2 and kernel.most_in_setup == 2
            assert handler.locks_in_use == 0  # no lock outlives its container's work
            await handler(request("DEL", cid="c0ffee0a", pod="a"))
            assert handler.locks_in_use == 0 and "c0ffee0a" not in kernel.veths


@pytest.mark.parametrize(
    "annotations, field, value",
    [
        ({A + "ipv6": "yes"}, A + "ipv6", "yes"),
        ({A + "cidr6": "2001:db8:9::/64"}, A + "cidr6", "2001:db8:9::/64"),
        ({A + "ip-algo": "namespace:16"}, A + "ip-algo", "namespace:16"),
        ({A + "addresses": "2001:db8:0:1::5,nonsense"}, A + "addresses", "2001:db8:0:1::5,nonsense"),
    ],
)
async def test_bad_annotations_fail_with_code_7_and_leave_nothing(autojump_clock, annotations, field, value):
    api = ObjectStore()
    api.create(PODS, pod_object("default", "web-0", NODE, annotations=annotations))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, rows, _, state):
            version = state.version
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD"))
            assert info.value.code == errors.INVALID_CONFIG
            assert field in info.value.details and repr(value) in info.value.details
            assert (rows.rows, kernel.veths, kernel.setups, held(handler)) == ({}, {}, 0, set())
            assert state.version == version  # nothing for BIRD or the metrics to see


@pytest.mark.parametrize(
    "args, detail",
    [
        ("K8S_POD_NAMESPACE=default", "K8S_POD_NAME is required"),
        ("K8S_POD_NAMESPACE=default;K8S_POD_NAME=Web_0", "K8S_POD_NAME='Web_0'"),
        ("K8S_POD_NAMESPACE=../etc;K8S_POD_NAME=web-0", "K8S_POD_NAMESPACE='../etc'"),
        ("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=x;y", None),
        ("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=a b", "K8S_POD_UID='a b'"),
    ],
)
async def test_bad_cni_args_fail_with_code_4_naming_the_key(autojump_clock, args, detail):
    api = ObjectStore()
    api.create(PODS, pod_object("default", "web-0", NODE))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, rows, _, _):
            req = request("ADD")
            req.args = args
            if detail is None:  # "x" is a fine UID; "y" without '=' is ignored, as CNI_ARGS says
                with pytest.raises(errors.CniError) as info:
                    await handler(req)
                assert info.value.code == errors.TRY_AGAIN_LATER and "K8S_POD_UID='x'" in info.value.details
            else:
                with pytest.raises(errors.CniError) as info:
                    await handler(req)
                assert info.value.code == errors.INVALID_ENV and detail in info.value.details
            assert (rows.rows, kernel.veths, held(handler)) == ({}, {}, set())


async def test_check_needs_a_well_formed_prev_result_that_matches(autojump_clock):
    api = ObjectStore()
    api.create(PODS, pod_object("default", "web-0", NODE))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, _rows, _, _):
            result = await handler(request("ADD"))
            for prev, code, detail in [
                (None, errors.INVALID_CONFIG, "no field 'prevResult'"),
                ("text", errors.INVALID_CONFIG, "prevResult='text'"),
                ({"ips": {}}, errors.INVALID_CONFIG, "prevResult.ips={}"),
                (
                    {"ips": [{"address": "2001:db8::zz/128"}]},
                    errors.INVALID_CONFIG,
                    "prevResult.ips[0].address='2001:db8::zz/128'",
                ),
                (
                    {"ips": [{"address": "2001:db8::1"}]},
                    errors.INVALID_CONFIG,
                    "prevResult.ips[0].address='2001:db8::1'",
                ),
                ({"ips": result["ips"][:1]}, CHECK_FAILED, f"missing from prevResult: {result['ips'][1]['address']}"),
            ]:
                config = {} if prev is None else {"prevResult": prev}
                with pytest.raises(errors.CniError) as info:
                    await handler(request("CHECK", **config))
                assert (info.value.code, detail in info.value.details) == (code, True), info.value
            assert await handler(request("CHECK", prevResult=result)) == {}
            del kernel.veths["c0ffee01"]
            with pytest.raises(errors.CniError) as info:
                await handler(request("CHECK", prevResult=result))
            assert info.value.code == CHECK_FAILED and "interface missing" in info.value.details
            with pytest.raises(errors.CniError) as info:
                await handler(request("CHECK", cid="unknown1", prevResult=result))
            assert info.value.code == errors.UNKNOWN_CONTAINER


async def test_exhausted_pool_fails_the_add_and_status_until_an_address_is_freed(autojump_clock):
    api = ObjectStore()
    for i in range(6):
        api.create(PODS, pod_object("default", f"p{i}", NODE, annotations={A + "ipv6": "false", A + "ipv4": "true"}))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, _kernel, rows, _, _):
            assert await handler(request("STATUS")) == {}
            got = [(await handler(request("ADD", cid=f"c{i}", pod=f"p{i}")))["ips"][0]["address"] for i in range(5)]
            assert got == [f"198.51.100.{i}/32" for i in range(2, 7)]  # /29: .0 network, .1 gateway, .7 broadcast
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD", cid="c5", pod="p5"))
            assert info.value.code == ADDRESS_EXHAUSTED and "c5" not in rows.rows and "c5" not in held(handler)
            with pytest.raises(errors.CniError) as info:
                await handler(request("STATUS"))
            assert info.value.code == errors.NOT_AVAILABLE and "198.51.100.0/29" in info.value.details
            await handler(request("DEL", cid="c3", pod="p3"))
            assert await handler(request("STATUS")) == {}
            assert (await handler(request("ADD", cid="c5", pod="p5")))["ips"][0]["address"] == "198.51.100.5/32"


async def test_not_ready_add_is_11_and_status_50_while_del_works(autojump_clock):
    api = ObjectStore()
    with trio.fail_after(10):
        async with handler_running(api, ready=False) as (handler, _kernel, _rows, _, _):
            with pytest.raises(errors.CniError) as add:
                await handler(request("ADD"))
            with pytest.raises(errors.CniError) as status:
                await handler(request("STATUS"))
            assert (add.value.code, status.value.code) == (errors.TRY_AGAIN_LATER, errors.NOT_AVAILABLE)
            assert await handler(request("DEL")) == {} and await handler(request("DEL")) == {}


async def test_failed_setup_gives_back_row_kernel_state_and_addresses(autojump_clock):
    api = ObjectStore()
    api.create(PODS, pod_object("default", "web-0", NODE))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, rows, _, _):
            kernel.fail_with = errors.CniError(
                errors.INVALID_ENV, "pod network namespace missing", "netns='/run/netns/c0ffee01'"
            )
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD"))
            assert info.value.code == errors.INVALID_ENV
            assert (rows.rows, kernel.veths, held(handler)) == ({}, {}, set())


async def test_a_failed_rollback_never_hides_the_adds_own_error(autojump_clock):
    api = ObjectStore()
    api.create(PODS, pod_object("default", "web-0", NODE))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, rows, _, _):
            kernel.fail_with = errors.CniError(errors.INVALID_ENV, "unusable network namespace", "netns='/x': loop")
            kernel.teardown_fails.add("c0ffee01")
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD"))
            assert (info.value.code, info.value.msg) == (errors.INVALID_ENV, "unusable network namespace")
            assert set(rows.rows) == {"c0ffee01"}  # kept pending for the DEL / GC that follows
            kernel.teardown_fails.clear()
            assert await handler(request("DEL")) == {}
            assert rows.rows == {} and held(handler) == set()


async def test_gc_removes_exactly_what_is_not_listed(autojump_clock):
    api = ObjectStore()
    for name in ("a", "b", "c"):
        api.create(PODS, pod_object("default", name, NODE))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, rows, _, _):
            for name in ("a", "b", "c"):
                await handler(request("ADD", cid=f"c0ffee0{name}", pod=name))
            for bad, detail in (
                [None, "no field 'cni.dev/valid-attachments'"],
                ["x", "expected a list"],
                [[{"containerID": 1}], "[0]="],
            ):
                config = {} if bad is None else {"cni.dev/valid-attachments": bad}
                with pytest.raises(errors.CniError) as info:
                    await handler(request("GC", **config))
                assert info.value.code == errors.INVALID_CONFIG and detail in info.value.details
            assert len(rows.rows) == 3
            valid = [{"containerID": "c0ffee0b", "ifname": "eth0"}, {"containerID": "c0ffee0c", "ifname": "eth1"}]
            assert await handler(request("GC", **{"cni.dev/valid-attachments": valid})) == {}
            assert set(rows.rows) == set(kernel.veths) == held(handler) == {"c0ffee0b"}
            assert set(handler.state.allocations) == {"c0ffee0b"}


async def test_gc_that_cannot_clean_one_row_goes_on_with_the_others(autojump_clock):
    api = ObjectStore()
    for name in ("a", "b", "c"):
        api.create(PODS, pod_object("default", name, NODE))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, rows, _, _):
            for name in ("a", "b", "c"):
                await handler(request("ADD", cid=f"c0ffee0{name}", pod=name))
            kernel.teardown_fails.add("c0ffee0a")  # sorted first: GC meets it before the others
            with pytest.raises(errors.CniError) as info:
                await handler(request("GC", **{"cni.dev/valid-attachments": []}))
            assert info.value.code == errors.IO_ERROR and "c0ffee0a" in info.value.details
            assert set(rows.rows) == set(kernel.veths) == {"c0ffee0a"}
            kernel.teardown_fails.clear()
            assert await handler(request("GC", **{"cni.dev/valid-attachments": []})) == {}
            assert rows.rows == {} and held(handler) == set()


async def test_a_retried_add_for_another_pod_with_the_same_container_id_is_refused(autojump_clock):
    api = ObjectStore()
    for name in ("a", "b"):
        api.create(PODS, pod_object("default", name, NODE))
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, _rows, _, _):
            first = await handler(request("ADD", pod="a"))
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD", pod="b"))
            assert info.value.code == errors.INVALID_ENV and "default/a" in info.value.details
            assert await handler(request("ADD", pod="a")) == first
            legacy = await handler(request("ADD", pod="a", cniVersion="0.3.1"))
            assert legacy["cniVersion"] == "0.3.1" and {ip["version"] for ip in legacy["ips"]} == {"6", "4"}
            assert ipaddress.ip_interface(first["ips"][0]["address"]).ip in NODE_CONFIG.cidr6
            assert first["ips"][0]["gateway"] == "fe80::1" and first["ips"][1]["gateway"] == "169.254.1.1"
            host_mac, pod_mac = fake_macs("c0ffee01")
            assert first["interfaces"] == [
                {"name": kernel.host_ifname("c0ffee01"), "mac": host_mac},
                {"name": "eth0", "mac": pod_mac, "sandbox": "/run/netns/c0ffee01"},
            ]
            assert {ip["interface"] for ip in first["ips"]} == {1}
            assert legacy["interfaces"] == first["interfaces"]
            same = request("ADD", pod="a")
            moved = Request(
                "ADD",
                container_id=same.container_id,
                netns="/run/netns/elsewhere",
                if_name=same.if_name,
                args=same.args,
                config=same.config,
            )
            with pytest.raises(errors.CniError) as info:
                await handler(moved)
            assert info.value.code == errors.INVALID_ENV and "/run/netns/elsewhere" in info.value.details


async def test_keyed_locks_wait_idle(autojump_clock):
    locks = KeyedLocks()
    with trio.fail_after(10):
        await locks.wait_idle()  # nothing held: at once
        assert trio.current_time() == 0

        async def hold(key, seconds):
            async with locks.hold(key):
                await trio.sleep(seconds)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold, "a", 2)
            nursery.start_soon(hold, "a", 1)
            nursery.start_soon(hold, "b", 5)
            await trio.sleep(0.5)
            assert len(locks) == 2 and locks.busy("a")
            await locks.wait_idle()
            assert trio.current_time() == 5 and len(locks) == 0


async def test_a_container_without_a_pod_gets_nodeconfig_defaults_without_waiting(autojump_clock):
    api = ObjectStore()
    with trio.fail_after(10):
        async with handler_running(api) as (handler, kernel, rows, source, _):
            podman = request("ADD", cid="c0ffee0a")
            podman.args = "IgnoreUnknown=1;K8S_POD_NAME=my_app.1"  # what rootful podman passes
            result = await handler(podman)
            assert trio.current_time() == 0 and source.gets == []  # no pod lookup, no wait
            row = rows.rows["c0ffee0a"]
            assert (row.namespace, row.pod, row.state) == ("", "my_app.1", AllocationState.COMMITTED)
            assert [ip["address"].count(":") > 1 for ip in result["ips"]] == [True, False]  # NodeConfig: both
            bare = request("ADD", cid="c0ffee0b")
            bare.args = ""  # CNI used directly: no label at all
            await handler(bare)
            assert (rows.rows["c0ffee0b"].namespace, rows.rows["c0ffee0b"].pod) == ("", "")
            # Options only from the network configuration's args (the conflist's author or the runtime).
            only6 = request("ADD", cid="c0ffee0c", args={A + "ipv4": False, "unrelated": {"x": 1}})
            only6.args = "K8S_POD_NAME=six"
            assert [ip["address"].endswith("/128") for ip in (await handler(only6))["ips"]] == [True]
            # A repeat answers the same; CHECK, DEL work as for pods; an ADD under another label is refused.
            assert await handler(podman) == result
            check = request("CHECK", cid="c0ffee0a", prevResult=result)
            check.args = podman.args
            assert await handler(check) == {}
            other = request("ADD", cid="c0ffee0a")
            other.args = "K8S_POD_NAME=someone-else"
            with pytest.raises(errors.CniError) as info:
                await handler(other)
            assert info.value.code == errors.INVALID_ENV
            for cid in ("c0ffee0a", "c0ffee0b", "c0ffee0c"):
                gone = request("DEL", cid=cid)
                gone.args = ""
                assert await handler(gone) == {}
            assert (rows.rows, kernel.veths, held(handler)) == ({}, {}, set())


@pytest.mark.parametrize(
    "args, config, code, detail",
    [
        ("K8S_POD_NAME=../x", {}, errors.INVALID_ENV, "K8S_POD_NAME='../x'"),
        ("K8S_POD_UID=abc", {}, errors.INVALID_ENV, "K8S_POD_NAMESPACE and K8S_POD_NAME are required"),
        ("", {"args": [1]}, errors.INVALID_CONFIG, "args=[1]"),
        ("", {"args": {A + "ipv4": 1}}, errors.INVALID_CONFIG, f"args['{A}ipv4']=1"),
        ("", {"args": {A + "ipv4": "maybe"}}, errors.INVALID_CONFIG, f"{A}ipv4='maybe'"),
    ],
)
async def test_bad_options_of_a_container_without_a_pod_are_named(autojump_clock, args, config, code, detail):
    with trio.fail_after(10):
        async with handler_running(ObjectStore()) as (handler, kernel, rows, _, _):
            req = request("ADD", **config)
            req.args = args
            with pytest.raises(errors.CniError) as info:
                await handler(req)
            assert info.value.code == code and detail in info.value.details, info.value
            assert (rows.rows, kernel.veths, held(handler)) == ({}, {}, set())


async def test_an_invalid_node_ip_algo_is_logged_by_the_handler_once_per_nodeconfig(autojump_clock, caplog):
    caplog.set_level(logging.WARNING, logger="flock.pods")
    obj = nodeconfig_object(NODE, "2001:db8:0:1::/64")
    obj["metadata"]["annotations"] = {A + "ip-algo": "pod:8"}
    node = NodeConfig.from_object(obj)
    handler = await serving_handler(PodWatcher(StoreSource(ObjectStore(), PODS, f"spec.nodeName={NODE}"), NODE), node)
    warned = [r for r in caplog.records if r.getMessage() == "ignoring invalid node-level ip-algo"]
    assert len(warned) == 1 and warned[0].value == "pod:8" and "no room for uniqueness" in warned[0].reason
    handler.apply_nodeconfig(node)  # the same ip-algo again: nothing new to say
    handler.apply_nodeconfig(NodeConfig.from_object(nodeconfig_object(NODE, "2001:db8:0:1::/64")))
    assert len([r for r in caplog.records if r.getMessage() == "ignoring invalid node-level ip-algo"]) == 1
    assert handler.ipam.layout_problem is None
