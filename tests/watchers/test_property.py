"""Whatever happens on the server, the pod cache ends equal to it (Hypothesis, virtual time).

Random writes on this node and others, compactions (with and without expiring
the open watch) and 5xx bursts on lists, interleaved with virtual sleeps; then
the cache must equal the server's pods on this node, object for object.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from flock.apiserver import PODS, ObjectStore, pod_object
from flock.model import PodInfo
from flock.nursery import Backoff
from flock.testing import StoreSource, serving
from flock.watchers import InformerSettings, PodWatcher

NODE = "host001"
NODES = st.sampled_from([NODE, NODE, "host002", ""])
WRITES = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 3), NODES),
    st.tuples(st.just("update"), st.integers(0, 3), NODES),
    st.tuples(st.just("delete"), st.integers(0, 3)),
    st.tuples(st.just("compact"), st.booleans()),
    st.tuples(st.just("fail_lists"), st.integers(1, 3)),
)
# A burst of writes with no checkpoint in between, then a virtual pause.
STEPS = st.lists(st.tuples(st.lists(WRITES, max_size=6), st.sampled_from([0, 0.1, 1, 5, 70])), max_size=12)


def apply(store: ObjectStore, source: StoreSource, op: tuple[Any, ...]) -> None:
    """Do *op* on the server (a write that cannot apply, e.g. deleting a missing pod, is skipped)."""
    kind = op[0]
    existing = {o["metadata"]["name"]: o for o in store.list(PODS)[0]}
    if kind == "create" and f"p{op[1]}" not in existing:
        store.create(PODS, pod_object("ns", f"p{op[1]}", op[2]))
    elif kind == "update" and f"p{op[1]}" in existing:
        pod = store.get(PODS, f"p{op[1]}", "ns")
        pod["spec"]["nodeName"] = op[2]
        pod["metadata"]["annotations"] = {"rev": pod["metadata"]["resourceVersion"]}
        store.update(PODS, pod)
    elif kind == "delete" and f"p{op[1]}" in existing:
        store.delete(PODS, f"p{op[1]}", "ns")
    elif kind == "compact":
        store.compact(expire_watches=op[1])
    elif kind == "fail_lists":
        source.fail_lists = op[1]


@settings(max_examples=40, deadline=None)
@given(STEPS)
def test_cache_converges_to_server_state(steps: list[tuple[list[tuple[Any, ...]], float]]) -> None:
    store = ObjectStore()
    source = StoreSource(store, PODS, f"spec.nodeName={NODE}")
    watcher = PodWatcher(
        source,
        NODE,
        InformerSettings(
            watch_seconds=60, request_seconds=5, relist_seconds=600, backoff=Backoff(initial=0.5, cap=4.0, jitter=0.2)
        ),
    )

    async def scenario() -> None:
        with trio.fail_after(10_000):
            async with serving(watcher):
                for writes, pause in steps:
                    for op in writes:
                        apply(store, source, op)
                    await trio.sleep(pause)
                await trio.sleep(30)  # longer than any backoff in play: the informer has caught up
                want = {
                    f"ns/{o['metadata']['name']}": o for o in store.list(PODS)[0] if o["spec"].get("nodeName") == NODE
                }
                cached = {k: r.local for k, r in watcher.informer.objects.items()}
                assert cached == {k: PodInfo.from_object(o) for k, o in want.items()}
                assert dict(watcher.pods) == {k: PodInfo.from_object(o) for k, o in want.items()}

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))
