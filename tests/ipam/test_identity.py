import pytest

from flock.ipam import app_name, fnv1a_32, fnv1a_64, image_name, parse_layout, pod_identity
from flock.model import OwnerRef, PodInfo
from flock.testing.ipam import pod, replica


def test_fnv_reference_vectors():
    assert fnv1a_64("") == 0xCBF29CE484222325
    assert fnv1a_64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64("foobar") == 0x85944171F73967E8
    assert fnv1a_32("a") == 0xE40C292C
    assert fnv1a_32("foobar") == 0xBF9CF968


@pytest.mark.parametrize(
    "info, expected",
    [
        (replica("web-7d9c5b8f6d-x2x4z"), "web"),  # label strips the hash
        (pod("web-7d9c5b8f6d-x2x4z", owner=("ReplicaSet", "web-7d9c5b8f6d")), "web"),  # no label: trailing hash
        (replica("x", rs="frontend", template_hash="7d9c5b8f6d"), "frontend"),  # custom RS naming
        (pod("fe-abcde", owner=("ReplicaSet", "web-frontend")), "web-frontend"),  # not a hash: vowels
        (pod("db-0", owner=("StatefulSet", "db")), "db"),
        (pod("agent-x9x9x", owner=("DaemonSet", "agent")), "agent"),
        (pod("backup-28391-abcde", owner=("Job", "backup-28391")), "backup-28391"),
        (pod("lonely"), "lonely"),
    ],
)
def test_app_name(info, expected):
    assert app_name(info) == expected


def test_app_name_prefers_the_controller_owner():
    info = PodInfo(
        namespace="prod",
        name="p",
        owners=(OwnerRef("ConfigMap", "cm"), OwnerRef("StatefulSet", "db", controller=True)),
    )
    assert app_name(info) == "db"


def test_image_is_first_container_else_fnv_of_container_id():
    assert image_name(pod(image="registry.example/app:2"), "c1") == "registry.example/app:2"
    assert image_name(pod(image=None), "c1") == f"{fnv1a_64('c1'):016x}"
    assert image_name(pod(image=None), "c1") != image_name(pod(image=None), "c2")


def test_identity_carries_every_named_field():
    ident = pod_identity(replica("web-7d9c5b8f6d-aaaaa"), "host001", "cid")
    assert (ident.namespace, ident.app, ident.image, ident.pod, ident.node) == (
        "prod",
        "web",
        "nginx:1",
        "web-7d9c5b8f6d-aaaaa",
        "host001",
    )


def test_layout_parses_fields_in_order():
    layout = parse_layout("namespace:16, app:16,image:8,pod:4,node:4,n:4,random:12")
    assert [(f.name, f.bits) for f in layout.fields] == [
        ("namespace", 16),
        ("app", 16),
        ("image", 8),
        ("pod", 4),
        ("node", 4),
        ("n", 4),
        ("random", 12),
    ]
    assert layout.bits == 64
