"""spec.mtu: the model and the CRD schema accept and refuse the same values."""

from pathlib import Path

import pytest
import yaml

from flock.apiserver import k8s_schema
from flock.model import MTU_DEFAULT, MTU_MAX, MTU_MIN, InvalidObject, NodeConfig, UplinkMtu

CRD = Path(__file__).parents[2] / "deploy" / "crd-nodeconfig.yaml"


def _schema() -> dict:
    (crd,) = [d for d in yaml.safe_load_all(CRD.read_text()) if d]
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def nodeconfig(**spec) -> dict:
    return {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "NodeConfig",
        "metadata": {"name": "host001"},
        "spec": {"cidr6": "2001:db8:0:1::/64", **spec},
    }


@pytest.mark.parametrize("mtu", [1280, 1500, 9000, 9216])
def test_mtu_in_bounds_accepted_by_model_and_crd(mtu):
    obj = nodeconfig(mtu=mtu)
    assert k8s_schema.errors(_schema(), obj) == []
    assert NodeConfig.from_object(obj).mtu == mtu


@pytest.mark.parametrize("mtu", [1279, 9217, 0, -1, "9000", True, 1500.5])
def test_mtu_out_of_bounds_refused_by_model_and_crd_naming_the_field(mtu):
    obj = nodeconfig(mtu=mtu)
    errors = k8s_schema.errors(_schema(), obj)
    assert errors and all("mtu" in e for e in errors), errors
    with pytest.raises(InvalidObject) as caught:
        NodeConfig.from_object(obj)
    assert caught.value.field == "spec.mtu"
    assert "spec.mtu" in str(caught.value) and "1280..9216" in str(caught.value)


def test_mtu_bounds_are_the_crds():
    mtu = _schema()["properties"]["spec"]["properties"]["mtu"]
    assert (mtu["type"], mtu["minimum"], mtu["maximum"]) == ("integer", MTU_MIN, MTU_MAX)


def test_mtu_absent_means_detected():
    assert NodeConfig.from_object(nodeconfig()).mtu is None


def test_uplink_mtu_says_where_it_came_from():
    assert UplinkMtu(9000, "eth0", 6).describe() == "detected from eth0's IPv6 default route"
    assert UplinkMtu(1450, "bond0", 4).describe() == "detected from bond0's IPv4 default route"
    assert UplinkMtu().mtu == MTU_DEFAULT
    assert UplinkMtu().describe() == "default (the node has no default route)"
