"""Every error flock prints stays under 4 KiB whatever the input (issue 25).

Each CNI_* variable and each configuration field flock reads, 100 KB long (and
binary, invalid UTF-8, control characters where the environment allows),
through the real bundled plugin against a real flock-agent and with the agent
down: stdout is one JSON document under 4096 bytes, the exit status is 1, the
field is named, and the agent keeps serving with nothing leaked.  The agent's
own replies are bounded too (a client of our own making skips the shim's checks)."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest

from flock.apiserver import PODS, pod_object
from flock.errors import MAX_ERROR_BYTES
from flock.testing.agentlab import open_lab
from flock.testing.shimrun import Outcome, run_plugin

pytestmark = pytest.mark.usefixtures("require_root")

BIG = 100_000
# Binary (undecodable bytes arrive as lone surrogates), control characters, an escape sequence:
# 15 bytes a repetition, 100 KB in all (one environment string may hold at most 128 KiB).
NASTY = "\udcff\x01\x1b[31m\u202e\x7f\U0001f600" * (BIG // 15)
POD_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with open_lab(tmp_path_factory.mktemp("bounded"), "fl-bnd-", bird=False) as node:
        node.api.create(PODS, pod_object("default", "web-0", "host001"))
        agent = node.agent()
        agent.wait_ready()
        yield SimpleNamespace(
            plugin=node.plugin,
            tmp=node.tmp,
            socket=node.socket,
            rows=node.rows,
            settle=node.settle,
            netns=node.pool.create("pod"),
            running=agent,
        )


def run(lab, command: str = "ADD", config: dict | bytes | None = None, down: bool = False, **env: str) -> Outcome:
    sock = str(lab.tmp / "down" / "flock.sock") if down else str(lab.socket)
    conf = {"cniVersion": "1.1.0", "name": "flock-net", "type": "flock", "socket": sock}
    if isinstance(config, dict):
        conf.update(config)
    full = {
        "CNI_CONTAINERID": "c0ffee25",
        "CNI_NETNS": lab.netns.path,
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": POD_ARGS,
        "CNI_PATH": "/opt/cni/bin",
        **env,
    }
    return run_plugin(lab.plugin, command, config if isinstance(config, bytes) else conf, lab.tmp, **full)


def assert_bounded(out: Outcome, *named: str) -> dict:
    raw = out.stdout.encode("utf-8", "surrogateescape")
    assert len(raw) < MAX_ERROR_BYTES, (len(raw), out.stdout[:300])
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1, out.stdout[:300]
    doc = json.loads(raw)
    assert set(doc) == {"cniVersion", "code", "msg", "details"}, doc
    assert out.status == 1 and isinstance(doc["code"], int) and doc["code"] != 100, (out.status, doc)
    text = doc["msg"] + " " + doc["details"]
    for name in named:
        assert name in text, (name, doc)
    return doc


def assert_serving(lab) -> None:
    """The agent is up, answers, and holds no allocation (nothing leaked, no queue wedged)."""
    assert lab.running.proc.poll() is None, lab.running.log.read_text()[-3000:]
    assert lab.rows() == {}
    status = run(lab, "STATUS")
    assert (status.status, status.stdout) == (0, ""), status


ENV_CASES = [
    ("CNI_COMMAND", {"CNI_COMMAND": "A" * BIG}, ("CNI_COMMAND",)),
    ("CNI_COMMAND binary", {"CNI_COMMAND": NASTY}, ("CNI_COMMAND",)),
    ("CNI_CONTAINERID", {"CNI_CONTAINERID": "c" * BIG}, ("CNI_CONTAINERID",)),
    ("CNI_CONTAINERID binary", {"CNI_CONTAINERID": NASTY}, ("CNI_CONTAINERID",)),
    ("CNI_NETNS", {"CNI_NETNS": "/" + "n" * BIG}, ("CNI_NETNS",)),
    ("CNI_NETNS binary", {"CNI_NETNS": "/" + NASTY}, ("CNI_NETNS",)),
    ("CNI_IFNAME", {"CNI_IFNAME": "e" * BIG}, ("CNI_IFNAME",)),
    ("CNI_IFNAME binary", {"CNI_IFNAME": NASTY}, ("CNI_IFNAME",)),
    ("K8S_POD_NAME", {"CNI_ARGS": POD_ARGS.replace("=web-0", "=" + "w" * BIG)}, ("CNI_ARGS", "K8S_POD_NAME")),
    ("K8S_POD_NAME binary", {"CNI_ARGS": POD_ARGS.replace("=web-0", "=" + NASTY)}, ("CNI_ARGS", "K8S_POD_NAME")),
    ("K8S_POD_NAMESPACE", {"CNI_ARGS": POD_ARGS.replace("=default", "=" + "d" * BIG)}, ("K8S_POD_NAMESPACE",)),
    ("K8S_POD_UID", {"CNI_ARGS": POD_ARGS + ";K8S_POD_UID=" + "u" * BIG}, ("K8S_POD_UID",)),
    (
        "K8S_POD_INFRA_CONTAINER_ID",
        {"CNI_ARGS": POD_ARGS + ";K8S_POD_INFRA_CONTAINER_ID=" + "f" * BIG},
        ("K8S_POD_INFRA_CONTAINER_ID",),
    ),
    ("unknown key", {"CNI_ARGS": POD_ARGS + ";FOO_BAR=" + NASTY}, ("FOO_BAR",)),
    ("unknown long key", {"CNI_ARGS": POD_ARGS + ";" + "K" * BIG + "=1"}, ("CNI_ARGS", "a key of")),
    ("CNI_ARGS no '='", {"CNI_ARGS": "x" * BIG}, ("CNI_ARGS",)),
]
# Checked by the agent, not the shim (under the shim's CNI_ARGS limit): named by the agent.
AGENT_ENV_CASES = [
    ("K8S_POD_NAME 4000", {"CNI_ARGS": POD_ARGS.replace("=web-0", "=" + "w" * 4000)}, ("K8S_POD_NAME",)),
    ("K8S_POD_NAME control", {"CNI_ARGS": POD_ARGS.replace("=web-0", "=" + NASTY[:4000])}, ("K8S_POD_NAME",)),
    ("K8S_POD_NAMESPACE 4000", {"CNI_ARGS": POD_ARGS.replace("=default", "=" + "d" * 4000)}, ("K8S_POD_NAMESPACE",)),
    ("K8S_POD_UID 4000", {"CNI_ARGS": POD_ARGS + ";K8S_POD_UID=" + NASTY[:4000]}, ("K8S_POD_UID",)),
    ("pod-less name", {"CNI_ARGS": "K8S_POD_NAME=" + NASTY[:4000]}, ("K8S_POD_NAME",)),
    ("namespace alone", {"CNI_ARGS": "K8S_POD_NAMESPACE=default;X=" + "x" * 4000}, ("K8S_POD_NAME",)),
]
A = "flock.fritzlab.net/"
CONFIG_CASES = [
    ("cniVersion", "ADD", {"cniVersion": "1" * BIG}, {}, ("cniVersion",)),
    ("cniVersion binary", "ADD", {"cniVersion": NASTY}, {}, ("cniVersion",)),
    ("socket", "ADD", {"socket": "/" + "s" * BIG}, {}, ("socket",)),
    ("rpcTimeout", "ADD", {"rpcTimeout": "t" * BIG}, {}, ("rpcTimeout",)),
    ("prevResult", "CHECK", {"prevResult": {"ips": [{"address": NASTY}]}}, {}, ("prevResult.ips[0].address",)),
    ("prevResult list", "CHECK", {"prevResult": ["p" * 1000] * 100}, {}, ("prevResult",)),
    ("prevResult ips", "CHECK", {"prevResult": {"ips": "i" * BIG}}, {}, ("prevResult.ips",)),
    (
        "valid-attachments",
        "GC",
        {"cni.dev/valid-attachments": [{"containerID": "c" * BIG}]},
        {},
        ("valid-attachments[0]",),
    ),
    ("valid-attachments type", "GC", {"cni.dev/valid-attachments": "v" * BIG}, {}, ("valid-attachments",)),
    ("args annotation", "ADD", {"args": {A + "ipv4": NASTY}}, {"CNI_ARGS": "K8S_POD_NAME=box"}, (A + "ipv4",)),
    ("args type", "ADD", {"args": ["a" * 1000] * 100}, {"CNI_ARGS": "K8S_POD_NAME=box"}, ("args",)),
    ("args ip-algo", "ADD", {"args": {A + "ip-algo": "x" * 4000}}, {"CNI_ARGS": "K8S_POD_NAME=box"}, (A + "ip-algo",)),
    ("name", "ADD", {"name": "n" * BIG}, {}, ("name",)),
    ("name binary", "GC", {"name": NASTY, "cni.dev/valid-attachments": []}, {}, ("name",)),
    (
        "portMappings hostPort",
        "ADD",
        {"runtimeConfig": {"portMappings": [{"hostPort": "p" * BIG, "containerPort": 80}], "x": NASTY}},
        {},
        ("runtimeConfig.portMappings[0].hostPort",),
    ),
    (
        "portMappings protocol",
        "ADD",
        {"runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": NASTY}]}},
        {},
        ("runtimeConfig.portMappings[0].protocol",),
    ),
    (
        "portMappings list",
        "ADD",
        {"runtimeConfig": {"portMappings": [{"hostPort": 8080 + i, "containerPort": 80} for i in range(5000)]}},
        {},
        ("runtimeConfig.portMappings",),
    ),
]
# Read by nobody in flock: a 100 KB value is no error; the ADD succeeds and the DEL cleans up.
IGNORED_CONFIG = [
    ("type", {"type": NASTY}),
    ("capabilities", {"capabilities": {"c" * BIG: True}}),
    ("runtimeConfig", {"runtimeConfig": {"bandwidth": {"x": "b" * BIG}, "x": NASTY}}),
]


@pytest.mark.parametrize(("env", "named"), [c[1:] for c in ENV_CASES], ids=[c[0] for c in ENV_CASES])
@pytest.mark.parametrize("down", [False, True], ids=["agent-up", "agent-down"])
def test_a_huge_or_binary_variable_is_named_in_a_bounded_error(lab, env, named, down):
    assert_bounded(run(lab, down=down, **env), *named)
    assert_serving(lab)


@pytest.mark.parametrize(("env", "named"), [c[1:] for c in AGENT_ENV_CASES], ids=[c[0] for c in AGENT_ENV_CASES])
def test_cni_args_the_agent_refuses_are_named_in_a_bounded_error(lab, env, named):
    assert_bounded(run(lab, **env), *named)
    assert_serving(lab)
    down = run(lab, down=True, **env)  # the shim cannot know: "try again later", bounded
    assert assert_bounded(down, "not reachable")["code"] == 11


@pytest.mark.parametrize(
    ("command", "config", "env", "named"), [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
@pytest.mark.parametrize("down", [False, True], ids=["agent-up", "agent-down"])
def test_a_huge_or_binary_config_field_is_named_in_a_bounded_error(lab, command, config, env, named, down):
    out = run(lab, command, config, down=down, **env)
    if down and command in ("ADD", "CHECK", "GC") and out.json.get("code") == 11:
        assert_bounded(out, "not reachable")  # checked by the agent only
    else:
        assert_bounded(out, *named)
    assert_serving(lab)


@pytest.mark.parametrize("config", [c[1] for c in IGNORED_CONFIG], ids=[c[0] for c in IGNORED_CONFIG])
def test_a_huge_field_flock_does_not_read_is_no_error(lab, config):
    add = run(lab, "ADD", config, CNI_PATH="/" + "p" * BIG)
    assert add.status == 0 and add.json["ips"], add.stdout[:300]
    dele = run(lab, "DEL", config)
    assert (dele.status, dele.stdout) == (0, ""), dele
    lab.settle()
    assert_serving(lab)


@pytest.mark.parametrize(
    "stdin",
    [b"\xff" * BIG, b'{"cniVersion": "1.1.0", "name": "\xff' + b"x" * BIG, b"{" + b"\x01" * BIG, b"[" * BIG],
    ids=["binary", "invalid-utf8-in-a-string", "control", "deep"],
)
@pytest.mark.parametrize("down", [False, True], ids=["agent-up", "agent-down"])
def test_undecodable_stdin_is_a_bounded_error(lab, stdin, down):
    assert_bounded(run(lab, "ADD", stdin, down=down), "stdin")
    assert_serving(lab)


def test_a_huge_cni_args_does_not_stop_a_del(lab):
    out = run(lab, "DEL", CNI_ARGS=POD_ARGS.replace("=web-0", "=" + NASTY))
    assert (out.status, out.stdout) == (0, ""), out
    assert_serving(lab)


def raw_call(path, obj: dict) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(str(path))
        s.sendall(json.dumps(obj).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    return reply


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("containerID", "c" * BIG, "containerID"),
        ("ifName", NASTY, "ifName"),
        ("netns", "n" * BIG, "netns"),
        ("args", POD_ARGS.replace("=web-0", "=" + NASTY), "K8S_POD_NAME"),
        ("args", POD_ARGS.replace("=web-0", "=" + "w" * 4000), "K8S_POD_NAME"),
        ("op", "X" * BIG, "op"),
        ("version", "9" * 4000, "version"),
        ("config", {"cniVersion": NASTY}, "cniVersion"),
        ("config", {"cniVersion": "1.1.0", "prevResult": {"ips": ["i" * BIG] * 50}}, "prevResult.ips[0]"),
    ],
)
def test_the_agent_bounds_its_replies_to_any_client(lab, field, value, named):
    request = {
        "version": 1,
        "op": "CHECK" if field == "config" else "ADD",
        "containerID": "c0ffee26",
        "netns": lab.netns.path,
        "ifName": "eth0",
        "args": POD_ARGS,
        "path": "/opt/cni/bin",
        "config": {"cniVersion": "1.1.0"},
        field: value,
    }
    reply = raw_call(lab.socket, request)
    assert len(reply) < MAX_ERROR_BYTES, len(reply)
    error = json.loads(reply)["error"]
    assert named in error["msg"] + error["details"], error
    assert_serving(lab)


@pytest.mark.parametrize(
    ("code", "msg", "details"),
    [
        (4, "m" * 10_000, "d" * 100_000),
        (4, "\x00" * 5000, "\U0001f600" * 5000),
        (10**40, "huge code", "x"),
        (-1, "negative code", "\udcff" * 3000),
    ],
)
def test_the_shims_last_line_of_defence_keeps_one_valid_document(code, msg, details):
    from flock.cni_shim import error_document

    text = error_document("1.1.0", code, msg, details)  # fields as they come, not bounded by a CniError
    assert len(text.encode()) < MAX_ERROR_BYTES and text.endswith("\n") and text.count("\n") == 1
    doc = json.loads(text)
    assert set(doc) == {"cniVersion", "code", "msg", "details"} and 0 <= doc["code"] < 2**32
