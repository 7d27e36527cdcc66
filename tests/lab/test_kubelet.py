"""The kubelet's part of a lab pod (flock.lab._kubelet), without a lab: the status written once a
pod serves, readiness flips, and the termination lock two tearers-down share."""

from __future__ import annotations

from pathlib import Path

from flock.apiserver import PODS, pod_object
from flock.apiserver._tables import table
from flock.lab._kubelet import is_ready, pod_status, terminating, with_readiness
from flock.lab._plan import LabPlan


def test_status_of_a_serving_pod_reads_as_a_kubelets(tmp_path: Path) -> None:
    node = LabPlan.make(tmp_path, 2).node("node2")
    status = pod_status(["2001:db8:0:2::5", "198.51.100.69"], node, "c0ffee" * 10, "app:1", ready=True)
    assert status["phase"] == "Running" and status["podIP"] == "2001:db8:0:2::5"
    assert status["podIPs"] == [{"ip": "2001:db8:0:2::5"}, {"ip": "198.51.100.69"}]
    assert status["hostIP"] == str(node.addr6)
    kinds = {c["type"]: c["status"] for c in status["conditions"]}
    assert kinds["Ready"] == kinds["ContainersReady"] == "True" and is_ready(status)
    pod = {**pod_object("shop", "web-1", "node2"), "metadata": {"name": "web-1", "namespace": "shop"}}
    pod["status"] = status
    row = table(PODS, [pod], include_object="", list_meta={})["rows"][0]["cells"]
    assert row[1:3] == ["1/1", "Running"]  # what `kubectl get pods` prints


def test_readiness_flips_conditions_and_containers() -> None:
    status = pod_status(["2001:db8:0:1::5"], LabPlan.make(Path("/tmp/x"), 1).node("node1"), "ab" * 32, "a:1", True)
    off = with_readiness(status, False)
    assert not is_ready(off) and [c["ready"] for c in off["containerStatuses"]] == [False]
    assert {c["type"]: c["status"] for c in off["conditions"]}["ContainersReady"] == "False"
    # The other conditions, and an unchanged condition's transition time, stay.
    assert {c["type"]: c["status"] for c in off["conditions"]}["PodScheduled"] == "True"
    again = with_readiness(off, False)
    assert again["conditions"] == off["conditions"]
    assert is_ready(with_readiness(off, True))
    assert not is_ready({}) and not is_ready(None)


def test_one_tearer_down_at_a_time(tmp_path: Path) -> None:
    plan = LabPlan.make(tmp_path, 1)
    plan.pods_dir.mkdir(parents=True)
    with terminating(plan, "shop", "web-1") as first:
        assert first
        with terminating(plan, "shop", "web-1") as second:
            assert not second  # someone else is at it
        with terminating(plan, "shop", "web-2") as other:
            assert other
    with terminating(plan, "shop", "web-1") as later:
        assert later  # released, and its file gone afterwards
    assert list(plan.pods_dir.iterdir()) == []
