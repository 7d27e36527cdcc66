"""Property tests: the shim's ``run(env, stdin, stdout)`` (its fast path and the full one, which must agree) in-process, against an
unreachable agent and a real unix-socket peer answering arbitrary bytes.

Whatever the runtime hands it, the shim exits 0 or 1 and prints one well-formed
CNI object — never code 100 ("flock shim failed" is a shim bug) and never a
file outside the pending-deletes directory."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import tempfile
import threading

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flock import cni_fastpath, cni_shim
from flock.errors import INTERNAL

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")
VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
ENV_NAMES = ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
TRAVERSALS = ("../x", "..", ".", "/", "/etc/passwd", "a/../../b", "x\x00y", "a/b", "\\..\\x", "a\nb", "é", "")

env_text = st.one_of(
    st.text(max_size=12),
    st.text(max_size=12).map(lambda t: t.replace("\x00", "")),
    st.sampled_from(TRAVERSALS),
    st.just("x" * 5000),
    st.just("\udcff\udc80"),  # what os.environ holds for non-UTF-8 bytes
    st.sampled_from(["c0ffee01", "/run/netns/x", "eth0", "K8S_POD_NAMESPACE=d;K8S_POD_NAME=p", "/opt/cni/bin"]),
    # CNI_NETNS candidates: a namespace, one of another kind, a device, a file, a directory, a loop.
    st.sampled_from(["/proc/self/ns/net", "/proc/self/ns/uts", "/dev/null", "/etc/hostname", "/", "/proc/self/cwd/x"]),
)


@st.composite
def envs(draw):
    env = {"CNI_COMMAND": draw(st.sampled_from(COMMANDS) | st.text(max_size=6))}
    for name in ENV_NAMES:
        if draw(st.booleans()):
            env[name] = draw(env_text)
    return env


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# Never a usable absolute path: a DEL would record itself beside it, outside the test's directory.
bad_sockets = st.sampled_from(
    ["", "relative.sock", "./x", "/a\x00b", "/" + "s" * 200, "/x\ud800"]
) | json_values.filter(lambda v: not (isinstance(v, str) and v.startswith("/")))


@st.composite
def stdins(draw, socket_path: str):
    """Network configurations from good to garbage; any absolute socket is *socket_path*."""
    kind = draw(st.sampled_from(("config", "config", "config", "json", "bytes")))
    if kind == "bytes":
        return draw(st.binary(max_size=60))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    config = draw(
        st.dictionaries(
            st.sampled_from(["name", "type", "prevResult", "cni.dev/valid-attachments"]), json_values, max_size=3
        )
    )
    if draw(st.booleans()):
        config["cniVersion"] = draw(st.sampled_from(VERSIONS) | json_values)
    socket_choice = draw(st.sampled_from(("ours", "ours", "bad")))
    config["socket"] = socket_path if socket_choice == "ours" else draw(bad_sockets)
    if draw(st.booleans()):
        config["rpcTimeout"] = draw(
            st.sampled_from([0.5, 1, 0, -1, float("inf"), float("nan"), 1e300, 10**400, True, "5"]) | json_values
        )
    # deep nesting sometimes, beyond what json can decode
    if draw(st.integers(0, 9)) == 0:
        return json.dumps(config).encode()[:-1] + b',"deep":' + b"[" * 5000 + b"]" * 5000 + b"}"
    return json.dumps(config).encode()


def run_shim(env, stdin) -> tuple[int, dict]:
    """The fast path (the bundle's entry) and the full shim on the same input: they must agree exactly."""
    fast_out, out = io.StringIO(), io.StringIO()
    fast_status = cni_fastpath.run(env, stdin, fast_out)
    status = cni_shim.run(env, stdin, out)
    text = out.getvalue()
    assert (fast_status, fast_out.getvalue()) == (status, text)
    assert status in (0, 1)
    assert text.count("\n") <= 1
    obj = json.loads(text) if text else None
    if status == 1:
        assert isinstance(obj, dict) and set(obj) == {"cniVersion", "code", "msg", "details"}, obj
        assert isinstance(obj["cniVersion"], str) and isinstance(obj["code"], int) and obj["msg"]
        assert obj["code"] != INTERNAL, obj  # the shim's own catch-all: a bug
    return status, obj


def files_under(root: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


@FUZZ
@given(data=st.data())
def test_any_env_and_stdin_against_an_unreachable_agent(data):
    with tempfile.TemporaryDirectory() as root:
        sock = os.path.join(root, "run", "flock.sock")
        os.mkdir(os.path.dirname(sock))
        env = data.draw(envs())
        # The journal as the installer would place it: beside the agent's socket (never the host's /run/flock).
        env["FLOCK_PENDING_DELETES"] = os.path.join(root, "run", "pending-deletes")
        stdin = data.draw(stdins(sock))
        status, _ = run_shim(env, stdin)
        written = files_under(root)
        if env["CNI_COMMAND"] == "DEL" and status == 0:
            # recorded in the pending-deletes directory under its own (valid) name
            assert written == {f"run/pending-deletes/{env['CNI_CONTAINERID']}.json"}
        else:
            assert written == set()
        if env["CNI_COMMAND"] not in ("DEL", "VERSION"):
            assert status == 1


@pytest.mark.parametrize("cid", TRAVERSALS)
def test_del_container_id_cannot_escape_the_pending_deletes_directory(tmp_path, cid):
    sock = tmp_path / "run" / "flock.sock"
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0"}
    status, obj = run_shim(env, json.dumps({"cniVersion": "1.1.0", "socket": str(sock)}).encode())
    assert status == 1 and obj["code"] == 4
    assert files_under(str(tmp_path)) == set()


@pytest.mark.parametrize(
    "config, code, named",
    [
        ({"socket": "{tmp}/run\x00/flock.sock"}, 7, "socket="),
        ({"socket": "{tmp}/" + "s" * 120}, 7, "socket="),
        ({"socket": "{tmp}/x\ud800"}, 7, "socket="),  # not encodable as a file name
        ({"rpcTimeout": float("inf")}, 7, "rpcTimeout=inf"),
        ({"rpcTimeout": 1e300}, 7, "rpcTimeout=1e+300"),
        ({"rpcTimeout": 10**400}, 7, "rpcTimeout="),
        ({"deep": [[[[]]]], "cniVersion": "1.1.0"}, 6, "stdin"),
        ({"deep900": [[[[]]]], "cniVersion": "1.1.0"}, 6, "stdin: nested more than 64 levels deep"),
    ],
)
def test_regressions_that_used_to_be_code_100(tmp_path, config, code, named):
    # inf / 1e300 / 10**400 escaped as OverflowError, deep JSON as RecursionError,
    # a NUL in socket cut the path short (and misplaced pending deletes).
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c0ffee01", "CNI_IFNAME": "eth0"}
    # every socket lies in tmp_path, so even the unfixed shim wrote nowhere else
    config = {k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in config.items()}
    raw = json.dumps({"cniVersion": "1.1.0", "socket": str(tmp_path / "flock.sock"), **config})
    if "deep" in config:
        raw = raw.replace("[[[[]]]]", "[" * 100_000 + "]" * 100_000)
    if "deep900" in config:  # decodes, but json.dumps of the request recursed too deep
        raw = raw.replace("[[[[]]]]", "[" * 900 + "]" * 900)
    status, obj = run_shim(env, raw.encode())
    assert status == 1 and obj["code"] == code and named in obj["details"]
    assert files_under(str(tmp_path)) == set()


def test_version_with_deeply_nested_stdin_still_answers():
    status, obj = run_shim({"CNI_COMMAND": "VERSION"}, b"[" * 100_000)
    assert status == 0 and obj["cniVersion"] == "1.1.0"


@contextlib.contextmanager
def answering_agent(path: str, reply: bytes):
    """A real unix-socket peer that reads one line and answers *reply*."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while b"\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                if reply:
                    conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)


reply_values = st.one_of(
    json_values.map(lambda v: {"result": v}),
    json_values.map(lambda v: {"result": {"ips": v}}),
    json_values.map(lambda v: {"result": {"interfaces": v, "routes": v}}),
    json_values.map(lambda v: {"result": {"ips": [v]}}),
    json_values.map(lambda v: {"error": v}),
    json_values,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reply=reply_values.map(lambda v: json.dumps(v).encode() + b"\n") | st.binary(max_size=40).map(lambda b: b + b"\n"),
    command=st.sampled_from(("ADD", "CHECK", "STATUS", "GC", "DEL")),
    version=st.sampled_from(VERSIONS),
)
@example(reply=b'{"result":{"ips":5}}\n', command="ADD", version="0.4.0")
@example(reply=b'{"result":{"interfaces":[1]}}\n', command="ADD", version="1.1.0")
def test_any_agent_reply_becomes_a_result_or_a_cni_error(reply, command, version):
    with tempfile.TemporaryDirectory() as root:
        sock = os.path.join(root, "flock.sock")
        with answering_agent(sock, reply):
            env = {
                "CNI_COMMAND": command,
                "CNI_CONTAINERID": "c0ffee01",
                "CNI_NETNS": "/proc/self/ns/net",  # a network namespace the shim can open and send
                "CNI_IFNAME": "eth0",
                "CNI_ARGS": "K8S_POD_NAMESPACE=d;K8S_POD_NAME=p",
                "FLOCK_PENDING_DELETES": os.path.join(root, "pending-deletes"),
            }
            status, obj = run_shim(env, json.dumps({"cniVersion": version, "socket": sock, "rpcTimeout": 5}).encode())
        if status == 0 and command == "ADD":
            assert obj["cniVersion"] == version


@pytest.mark.parametrize(
    "name, value",
    [("CNI_NETNS", "/run/netns/x\x00"), ("CNI_NETNS", "netns"), ("CNI_IFNAME", "../eth0"), ("CNI_IFNAME", "e" * 16)],
)
def test_bad_netns_or_if_name_is_code_4_before_dialling(tmp_path, name, value):
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c0ffee01", "CNI_IFNAME": "eth0", name: value}
    status, obj = run_shim(env, json.dumps({"cniVersion": "1.1.0", "socket": str(tmp_path / "flock.sock")}).encode())
    assert status == 1 and obj["code"] == 4 and obj["details"].startswith(f"{name}={value!r}")
    assert files_under(str(tmp_path)) == set()  # not recorded as a pending delete either
