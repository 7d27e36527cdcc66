import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flock.errors import CniError
from flock.rpc import (
    MAX_LINE_BYTES,
    LineReader,
    Request,
    check_cni_version,
    convert_result,
    decode_response,
    encode_error,
    encode_result,
    version_reply,
)


def request_obj(**over):
    obj = {
        "version": 1,
        "op": "ADD",
        "containerID": "c0ffee",
        "netns": "/var/run/netns/x",
        "ifName": "eth0",
        "args": "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web-0",
        "path": "/opt/cni/bin",
        "config": {"cniVersion": "1.1.0", "name": "flock"},
    }
    obj.update(over)
    return obj


def line(obj):
    return json.dumps(obj).encode() + b"\n"


def decode_error(raw):
    with pytest.raises(CniError) as info:
        Request.decode(raw)
    return info.value


def test_request_encodes_exactly_the_design_fields():
    req = Request.decode(line(request_obj()))
    assert json.loads(req.encode()) == request_obj()
    assert req.encode().endswith(b"\n") and req.encode().count(b"\n") == 1
    assert req.pod == "prod/web-0"
    assert (req.op, req.container_id, req.if_name) == ("ADD", "c0ffee", "eth0")


ids = st.text(alphabet="abcdef0123456789_.-", min_size=0, max_size=20).map(lambda s: "a" + s)


@settings(max_examples=50)
@given(
    op=st.sampled_from(["ADD", "DEL", "CHECK", "STATUS", "GC"]),
    cid=ids,
    args=st.text(max_size=40),
    config=st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=4),
)
def test_request_round_trips(op, cid, args, config):
    req = Request(op=op, container_id=cid, netns="/n", if_name="eth0", args=args, path="/p", config=config)
    raw = req.encode()
    assert raw.count(b"\n") == 1
    assert Request.decode(raw) == req


@pytest.mark.parametrize("version", [3, 0, "1", True, None, 1.0])
def test_unknown_protocol_version_is_202_listing_spoken_versions(version):
    err = decode_error(line(request_obj(version=version)))
    assert err.code == 202
    assert "speaks versions 1, 2" in err.details
    assert repr(version) in err.details


@pytest.mark.parametrize(
    "raw, code, fragment",
    [
        (b"not json\n", 6, "not valid JSON"),
        (b"\xff\xfe\n", 6, "not UTF-8"),
        (b"[1, 2]\n", 6, "not a JSON object"),
        (line({k: v for k, v in request_obj().items() if k != "version"}), 4, "'version'"),
        (line({k: v for k, v in request_obj().items() if k != "op"}), 4, "'op'"),
        (line(request_obj(op="FROB")), 4, "'FROB'"),
        (line(request_obj(containerID="")), 4, "'containerID' is required for ADD"),
        (line(request_obj(netns="")), 4, "'netns' is required for ADD"),
        (line(request_obj(ifName=7)), 4, "'ifName'=7"),
        (line(request_obj(containerID="../../etc")), 4, "'../../etc'"),
        (line({k: v for k, v in request_obj().items() if k != "config"}), 4, "'config' is required"),
        (line(request_obj(config=[])), 4, "'config'=[]"),
    ],
)
def test_bad_requests_name_the_problem(raw, code, fragment):
    err = decode_error(raw)
    assert err.code == code
    assert fragment in err.msg + " " + err.details


def test_del_without_netns_and_status_without_ids_are_valid():
    assert Request.decode(line(request_obj(op="DEL", netns=""))).netns == ""
    status = Request.decode(line({"version": 1, "op": "STATUS", "config": {}}))
    assert (status.container_id, status.pod) == ("", "")


def test_oversized_line_is_4_request_too_large():
    raw = b'{"x": "' + b"a" * MAX_LINE_BYTES + b'"}\n'
    err = decode_error(raw)
    assert err.code == 4
    assert err.msg == f"request too large ({MAX_LINE_BYTES + 9} bytes, limit {MAX_LINE_BYTES})"


def test_request_limit_holds_a_4_mib_configuration():
    assert MAX_LINE_BYTES >= 4 << 20
    req = Request(op="ADD", container_id="c1", netns="/n", if_name="eth0", config={"blob": "x" * (4 << 20)})
    assert Request.decode(req.encode()) == req


def test_line_reader_limits_and_splits():
    reader = LineReader(limit=10)
    assert reader.feed(b"abc") is None
    assert reader.feed(b"def\nignored") == b"abcdef"
    reader = LineReader(limit=10)
    assert reader.feed(b"0123456789") is None
    with pytest.raises(CniError) as info:
        reader.feed(b"0")
    assert info.value.code == 4 and info.value.msg == "request too large (at least 11 bytes, limit 10)"
    with pytest.raises(CniError):
        LineReader(limit=4).feed(b"01234\n")
    half = LineReader()
    half.feed(b'{"ver')
    assert half.eof().code == 6 and "5 bytes" in half.eof().details


def test_responses_round_trip():
    assert decode_response(encode_result({"ips": []})) == {"ips": []}
    with pytest.raises(CniError) as info:
        decode_response(encode_error(CniError(11, "agent not ready", "no NodeConfig yet")))
    assert (info.value.code, info.value.msg, info.value.details) == (11, "agent not ready", "no NodeConfig yet")


@pytest.mark.parametrize("raw", [b"{}\n", b'{"result": 3}\n', b'{"error": "x"}\n', b"garbage\n"])
def test_malformed_responses_are_6(raw):
    with pytest.raises(CniError) as info:
        decode_response(raw)
    assert info.value.code == 6


RESULT_1_1 = {
    "cniVersion": "1.1.0",
    "interfaces": [
        {"name": "flock0a1b2c3d", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1500},
        {"name": "eth0", "mac": "aa:bb:cc:dd:ee:00", "sandbox": "/var/run/netns/x", "mtu": 1500},
    ],
    "ips": [
        {"address": "2001:db8::5/128", "gateway": "fe80::1", "interface": 1},
        {"address": "192.0.2.5/32", "gateway": "169.254.1.1", "interface": 1},
    ],
    "routes": [{"dst": "::/0", "gw": "fe80::1", "mtu": 1400}, {"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
    "dns": {},
}


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0"])
def test_legacy_results_carry_ip_version(version):
    out = convert_result(RESULT_1_1, version)
    assert out["cniVersion"] == version
    assert [ip["version"] for ip in out["ips"]] == ["6", "4"]
    assert [ip["gateway"] for ip in out["ips"]] == ["fe80::1", "169.254.1.1"]
    assert "mtu" not in out["interfaces"][0] and "mtu" not in out["routes"][0]
    assert out["interfaces"][1]["sandbox"] == "/var/run/netns/x"


def test_1_0_drops_ip_version_and_1_1_fields():
    out = convert_result(RESULT_1_1, "1.0.0")
    assert all("version" not in ip for ip in out["ips"])
    assert out["routes"][0] == {"dst": "::/0", "gw": "fe80::1"}
    assert convert_result(RESULT_1_1, "1.1.0") == RESULT_1_1


def test_cni_version_checks():
    assert check_cni_version({"cniVersion": "0.4.0"}) == "0.4.0"
    for bad in ({"cniVersion": "0.2.0"}, {}, {"cniVersion": 1}):
        with pytest.raises(CniError) as info:
            check_cni_version(bad)
        assert info.value.code == 1 and "cniVersion=" in info.value.details
    with pytest.raises(CniError):
        convert_result(RESULT_1_1, "2.0.0")
    assert version_reply("0.3.1")["cniVersion"] == "0.3.1"
    assert version_reply("7")["cniVersion"] == "1.1.0"


def test_a_full_result_converts_for_every_version_with_macs_sandbox_and_interface():
    full = {
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "flock1a2b3c4d", "mac": "0a:58:00:00:00:01"},
            {"name": "eth0", "mac": "0a:58:00:00:00:02", "sandbox": "/run/netns/p"},
        ],
        "ips": [
            {"address": "2001:db8::5/128", "gateway": "fe80::1", "interface": 1},
            {"address": "198.51.100.2/32", "gateway": "169.254.1.1", "interface": 1},
        ],
        "routes": [{"dst": "::/0", "gw": "fe80::1"}, {"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
    }
    for version in ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"):
        out = convert_result(full, version)
        assert out["cniVersion"] == version
        assert out["interfaces"] == full["interfaces"]  # name, mac, sandbox: defined since 0.3.0
        assert [ip["interface"] for ip in out["ips"]] == [1, 1]
        legacy = version.startswith("0.")
        assert [ip.get("version") for ip in out["ips"]] == (["6", "4"] if legacy else [None, None])
        assert out["routes"] == full["routes"]
