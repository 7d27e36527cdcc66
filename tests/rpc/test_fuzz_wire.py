"""Property tests: the wire format and result conversion never fail with
anything but a CniError naming the field (code 4, 6 or 202)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flock.errors import DECODE_ERROR, INCOMPATIBLE_PROTOCOL, INVALID_ENV, CniError
from flock.rpc import cniresult
from flock.rpc.wire import MAX_JSON_DEPTH, OPS, Request, decode_response, encode_error

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**305)
    | st.floats()
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ("version", "op", "containerID", "netns", "ifName", "args", "path", "config")
good_values = {
    "version": st.just(1),
    "op": st.sampled_from(OPS),
    "containerID": st.sampled_from(["c0ffee01", "a.b-c_d"]),
    "netns": st.just("/run/netns/x"),
    "ifName": st.just("eth0"),
    "args": st.just("K8S_POD_NAME=x"),
    "path": st.just("/opt/cni/bin"),
    "config": st.just({"cniVersion": "1.1.0"}),
}


@st.composite
def requests_with_any_field(draw):
    """A request object where each field is either valid, absent, or any JSON value."""
    obj = {}
    for name in FIELDS:
        choice = draw(st.sampled_from(("good", "good", "absent", "any")))
        if choice == "good":
            obj[name] = draw(good_values[name])
        elif choice == "any":
            obj[name] = draw(json_values)
    return obj


def deep(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def assert_request_verdict(line: bytes) -> None:
    try:
        Request.decode(line)
    except CniError as err:
        assert err.code in (INVALID_ENV, DECODE_ERROR, INCOMPATIBLE_PROTOCOL), err
        assert err.msg and err.details
        if err.code == INVALID_ENV:
            assert "field '" in err.details  # names the field


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_cni_error(line):
    assert_request_verdict(line)
    try:
        decode_response(line)
    except CniError as err:
        assert err.msg


@FUZZ
@given(requests_with_any_field())
def test_any_field_values_decode_or_name_the_field(obj):
    line = json.dumps(obj).encode()
    try:
        req = Request.decode(line)
    except CniError as err:
        assert err.code in (INVALID_ENV, DECODE_ERROR, INCOMPATIBLE_PROTOCOL)
        if err.code == INVALID_ENV:
            named = [f for f in FIELDS if f"'{f}'" in err.details]
            assert named, err.details
        return
    assert Request.decode(req.encode()) == req  # what decodes re-encodes to itself


@FUZZ
@given(st.text(max_size=60), st.binary(min_size=1, max_size=4).filter(lambda b: not _utf8(b)))
def test_non_utf8_is_code_6(text, junk):
    line = json.dumps({"version": 1, "op": "ADD", "netns": text}).encode() + junk
    with pytest.raises(CniError) as info:
        Request.decode(line)
    assert info.value.code == DECODE_ERROR


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 900, 2_000, 100_000])
@pytest.mark.parametrize("where", ["top", "config", "error"])
def test_deeply_nested_json_is_code_6(depth, where):
    # Regression: json raised RecursionError (not ValueError) past the recursion
    # limit; below it, a 900-deep config decoded but repr()/json.dumps of it a
    # few frames deeper (error details, the reply) raised RecursionError.
    line = {
        "top": deep(depth),
        "config": '{"version":1,"op":"ADD","config":' + deep(depth) + "}",
        "error": '{"error":{"code":7,"msg":' + deep(depth) + "}}",
    }[where].encode()
    decode = decode_response if where == "error" else Request.decode
    with pytest.raises(CniError) as info:
        decode(line)
    assert info.value.code == DECODE_ERROR
    # Which check catches it depends on the interpreter's recursion limit (other code may raise it).
    assert info.value.details in ("nested too deeply", f"nested more than {MAX_JSON_DEPTH} levels deep")


def test_json_nested_exactly_to_the_limit_decodes():
    # request object, config object, then MAX_JSON_DEPTH - 3 lists around an object: MAX_JSON_DEPTH levels
    value = json.loads(deep(MAX_JSON_DEPTH - 3, "{}"))
    req = Request.decode(json.dumps({"version": 1, "op": "STATUS", "config": {"x": value}}).encode())
    assert req.config == {"x": value}
    with pytest.raises(CniError):
        Request.decode(json.dumps({"version": 1, "op": "STATUS", "config": {"x": [value]}}).encode())


@FUZZ
@given(json_values)
def test_any_response_value_is_a_result_or_a_cni_error(value):
    for obj in ({"result": value}, {"error": value}, value):
        try:
            out = decode_response(json.dumps(obj).encode())
        except CniError as err:
            assert isinstance(err.code, int) and isinstance(err.msg, str)
        else:
            assert isinstance(out, dict)


# -- result conversion --------------------------------------------------------------

addresses = st.one_of(st.ip_addresses(v=6).map(lambda a: f"{a}/128"), st.ip_addresses(v=4).map(lambda a: f"{a}/32"))
interfaces = st.fixed_dictionaries(
    {"name": st.text(min_size=1, max_size=15)},
    optional={
        "mac": st.just("02:00:00:00:00:01"),
        "sandbox": st.text(max_size=20),
        "mtu": st.integers(576, 9000),
        "socketPath": st.text(max_size=20),
        "pciID": st.text(max_size=12),
    },
)
ips = st.fixed_dictionaries(
    {"address": addresses},
    optional={"gateway": st.sampled_from(["fe80::1", "169.254.1.1"]), "interface": st.integers(0, 3)},
)
routes = st.fixed_dictionaries(
    {"dst": st.sampled_from(["::/0", "0.0.0.0/0", "2001:db8::/32"])},
    optional={
        "gw": st.sampled_from(["fe80::1", "169.254.1.1"]),
        "mtu": st.integers(576, 9000),
        "advmss": st.integers(1, 9000),
        "priority": st.integers(0, 1000),
        "table": st.integers(0, 255),
        "scope": st.integers(0, 255),
    },
)
results_1_1 = st.fixed_dictionaries(
    {"cniVersion": st.just("1.1.0")},
    optional={
        "interfaces": st.lists(interfaces, max_size=3),
        "ips": st.lists(ips, max_size=4),
        "routes": st.lists(routes, max_size=3),
        "dns": st.fixed_dictionaries(
            {}, optional={"nameservers": st.lists(st.sampled_from(["2001:db8::53"]), max_size=2)}
        ),
    },
)
V1_1_ONLY_IFACE = {"mtu", "socketPath", "pciID"}
V1_1_ONLY_ROUTE = {"mtu", "advmss", "priority", "table", "scope"}


@FUZZ
@given(results_1_1, st.sampled_from(cniresult.SUPPORTED_VERSIONS))
def test_convert_result_keeps_what_the_version_defines(result, version):
    out = cniresult.convert_result(result, version)
    assert out["cniVersion"] == version
    json.dumps(out)  # serialisable
    for key in ("interfaces", "ips", "routes"):
        assert (key in out) == (key in result)
        if key in out:
            assert len(out[key]) == len(result[key])
    for src, ip in zip(result.get("ips", []), out.get("ips", []), strict=True):
        assert ip["address"] == src["address"]
        if version in ("0.3.0", "0.3.1", "0.4.0"):
            assert ip["version"] == ("6" if ":" in src["address"] else "4")
        else:
            assert "version" not in ip
    if version != "1.1.0":
        assert not any(V1_1_ONLY_IFACE & set(i) for i in out.get("interfaces", []))
        assert not any(V1_1_ONLY_ROUTE & set(r) for r in out.get("routes", []))
    else:
        assert out.get("interfaces") == result.get("interfaces") and out.get("routes") == result.get("routes")


@FUZZ
@given(json_values)
def test_convert_result_to_an_unsupported_version_is_code_1(version):
    if version in cniresult.SUPPORTED_VERSIONS:
        return
    with pytest.raises(CniError) as info:
        cniresult.convert_result({"cniVersion": "1.1.0"}, version)
    assert info.value.code == 1 and "cniVersion=" in info.value.details


@FUZZ
@given(st.sampled_from(("interfaces", "ips", "routes")), json_values, st.sampled_from(cniresult.SUPPORTED_VERSIONS))
def test_convert_result_of_a_malformed_result_is_code_6(key, value, version):
    # Regression: {"ips": 5} from a broken agent was a TypeError (code 100 in the shim).
    try:
        out = cniresult.convert_result({key: value}, version)
    except CniError as err:
        assert err.code == DECODE_ERROR and f"field '{key}'=" in err.details
    else:
        assert isinstance(value, list) and all(isinstance(v, dict) for v in value) and len(out[key]) == len(value)


def test_convert_result_names_the_malformed_field():
    with pytest.raises(CniError) as info:
        cniresult.convert_result({"ips": 5}, "0.4.0")
    assert (info.value.code, info.value.details) == (DECODE_ERROR, "field 'ips'=5: expected a list of objects")


@FUZZ
@given(
    st.text(max_size=20)
    | st.sampled_from([".", "..", "eth0", "a/b", "a:1", "a b", "x\x00", "é" * 8, "e" * 15, "e" * 16])
)
def test_if_name_is_accepted_only_when_the_kernel_would_take_it(if_name):
    line = json.dumps(
        {"version": 1, "op": "ADD", "containerID": "c1", "netns": "/run/netns/x", "ifName": if_name, "config": {}}
    ).encode()
    try:
        req = Request.decode(line)
    except CniError as err:
        assert err.code == INVALID_ENV and err.details.startswith("field 'ifName'")
        return
    raw = req.if_name.encode("utf-8")
    assert 0 < len(raw) <= 15 and req.if_name not in (".", "..")
    assert not any(c in "/:\x00" or c.isspace() for c in req.if_name)


@pytest.mark.parametrize(
    "field, value",
    [
        ("netns", "/run/netns/x\x00y"),
        ("netns", "run/netns/x"),
        ("ifName", "a/b"),
        ("ifName", "e" * 16),
        ("ifName", ".."),
        ("ifName", "x\udcff"),
    ],
)
def test_bad_netns_and_if_name_are_code_4_naming_the_field(field, value):
    # Regression: a NUL in netns reached os.open (ValueError → code 100); a bad
    # ifName allocated addresses and failed later inside netlink.
    obj = {
        "version": 1,
        "op": "ADD",
        "containerID": "c1",
        "netns": "/run/netns/x",
        "ifName": "eth0",
        "config": {},
        field: value,
    }
    with pytest.raises(CniError) as info:
        Request.decode(json.dumps(obj).encode())
    assert info.value.code == INVALID_ENV and info.value.details.startswith(f"field {field!r}={value!r}")


def test_error_reply_about_a_huge_field_fits_on_the_wire():
    # Regression: an 800 KB `op` list made a 1.2 MB error reply, which the shim
    # refused as "message too long" instead of showing which field was wrong.
    line = json.dumps({"version": 1, "op": [0] * 400_000}, separators=(",", ":")).encode()
    with pytest.raises(CniError) as info:
        Request.decode(line)
    reply = encode_error(info.value)
    assert len(reply) < 64 * 1024
    with pytest.raises(CniError) as relayed:
        decode_response(reply)
    assert relayed.value.code == INVALID_ENV and relayed.value.details.startswith("field 'op'=[0, 0")
    assert "(list of 400000 items)" in relayed.value.details and relayed.value.details.endswith(
        "expected one of ADD, DEL, CHECK, STATUS, GC"
    )
