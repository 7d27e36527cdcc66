"""The shim as a runtime sees it: the built one-file plugin, run as a subprocess."""

import ast
import binascii
import importlib.util
import json
import marshal
import os
import socket
import stat
import subprocess
import sys
import types
import zlib
from pathlib import Path

import pytest

import flock
from flock import cni_common, cni_shim, rpc
from flock import cni_fastpath as fastpath
from flock.rpc import cniresult, wire
from flock.shim_bundle import BOOT_MODULES, MAIN_MODULE, SHIM_MODULES, boot_sources, build_shim, bundled_sources
from flock.testing.shimrun import build, pod_env, run_plugin


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    return build(tmp_path_factory.mktemp("shim"))


@pytest.fixture(scope="module")
def pod_netns(pod_netns_path):
    return pod_netns_path


def journal(sock) -> dict[str, str]:
    """The env that points the shim's pending-deletes journal beside *sock* (as the installer would)."""
    return {"FLOCK_PENDING_DELETES": str(sock.parent / "pending-deletes")}


@pytest.fixture
def down_socket(tmp_path):
    """A socket path in a fresh directory where no agent listens."""
    return tmp_path / "run" / "flock.sock"


def cfg(sock, version="1.1.0", **extra):
    return {"cniVersion": version, "name": "flock-net", "type": "flock", "socket": str(sock), **extra}


def test_bundle_is_one_python38_file_with_only_bundled_imports(tmp_path):
    dest = tmp_path / "flock"
    build_shim(dest)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert dest.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.listdir(tmp_path) == ["flock"]  # no temp file left behind
    ast.parse(dest.read_text(), filename="flock", feature_version=(3, 8))  # the loader script itself
    sources = {**bundled_sources(), **dict(boot_sources())}
    assert [name for name, _ in boot_sources()] == ["flock.cni_common", "flock.cni_fastpath"]
    assert set(sources) == {"flock", "flock.rpc"} | {
        "flock." + m[:-3].replace("/", ".") for m in (*SHIM_MODULES, *BOOT_MODULES, MAIN_MODULE)
    }
    # flock._site is the installer's optional settings member (absent here: the default applies).
    bundled = set(sources) | {"flock._site"}
    for name, src in sources.items():
        tree = ast.parse(src, filename=name, feature_version=(3, 8))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if top == "flock":
                    assert mod in bundled, f"{name} imports {mod}, which the bundle lacks"
                else:
                    assert top in sys.stdlib_module_names or top == "__future__", f"{name} imports non-stdlib {mod}"


# What the shim's modules share has one home, flock.cni_common: the others import it, never copy it.
SHARING = (cni_shim, fastpath, wire, cniresult)
# The one shared name wrapped rather than imported: cniresult's words a malformed result as a CNI error.
WRAPPED = {"convert_result": (cniresult, cniresult.convert_result)}


def test_the_shared_values_have_one_home():
    shared = {
        name
        for name, value in vars(cni_common).items()
        if not name.startswith("_") and name != "TYPE_CHECKING" and not isinstance(value, types.ModuleType)
    }
    assert {"OPS", "SUPPORTED_VERSIONS", "MAX_REQUEST_BYTES", "call", "AgentUnreachable"} <= shared
    for module in SHARING:
        # Whatever a module holds under a shared name is the leaf's own object, not a copy.
        same = [n for n in shared if hasattr(module, n)]
        assert same, module.__name__
        for name in same:
            expected = WRAPPED[name][1] if name in WRAPPED and module is not fastpath else getattr(cni_common, name)
            assert getattr(module, name) is expected, f"{module.__name__}.{name}"
        # And none assigns one at module level (a copy would fall behind; the test above needs the import).
        tree = ast.parse(Path(module.__file__).read_text())
        assigned = {
            t.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        }
        defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        own = {name for name, (home, _) in WRAPPED.items() if home is module}
        redefined = sorted((assigned | defined) & shared - own)
        assert not redefined, f"{module.__name__} redefines {redefined}"


def test_the_shared_values_are_what_the_agent_decodes_with():
    """The agent's side of the wire (flock.rpc) answers with the values the shim sends by."""
    assert rpc.PROTOCOL_VERSION == cni_common.PROTOCOL_VERSION in rpc.SPOKEN_VERSIONS
    assert rpc.SUPPORTED_VERSIONS is cni_common.SUPPORTED_VERSIONS and rpc.OPS is cni_common.OPS
    assert rpc.MAX_LINE_BYTES == cni_common.MAX_REQUEST_BYTES
    assert cni_shim.DEFAULT_PENDING_DELETES_DIR == "/run/flock/" + rpc.PENDING_DELETES
    assert set(cni_common.REQUIRED_FIELDS) == set(cni_common.OPS)
    assert {f for fs in cni_common.REQUIRED_FIELDS.values() for f in fs} <= set(cni_common.ENV_OF_FIELD)


def _inlined(script: bytes) -> tuple[dict[str, types.CodeType], dict[str, str]]:
    """The loader's inlined modules in a built shim: name → code object (the building interpreter's
    bytecode) and name → source (what any other python compiles)."""
    tree = ast.parse(script.decode())
    literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    code = max((x for x in literals if all(c in "0123456789abcdef" for c in x)), key=len)
    (packed,) = (
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_BUNDLE" and isinstance(n.value, ast.Constant)
    )
    bundle = marshal.loads(zlib.decompress(binascii.a2b_base64(packed)))
    return dict(marshal.loads(bytes.fromhex(code))), dict(bundle["boot"])


def test_the_bundle_inlines_the_shared_values_unchanged(tmp_path):
    """The values a built shim runs with are flock.cni_common's: its bytecode (this interpreter) and its
    source (any other), run here, hold every shared name with an equal value."""
    dest = tmp_path / "flock"
    build_shim(dest)
    codes, sources = _inlined(dest.read_bytes())
    assert list(codes) == list(sources) == ["flock.cni_common", "flock.cni_fastpath"]
    assert sources["flock.cni_common"] == Path(cni_common.__file__).read_text()
    from_code: dict[str, object] = {"__name__": "flock.cni_common"}
    exec(codes["flock.cni_common"], from_code)
    from_source: dict[str, object] = {"__name__": "flock.cni_common"}
    exec(compile(sources["flock.cni_common"], "flock.cni_common", "exec", dont_inherit=True), from_source)
    constants = {
        name: value
        for name, value in vars(cni_common).items()
        if not name.startswith("__") and not callable(value) and not isinstance(value, types.ModuleType)
    }
    assert {"OPS", "SUPPORTED_VERSIONS", "MAX_REQUEST_BYTES", "REQUIRED_FIELDS", "DEFAULT_SOCKET"} <= set(constants)
    for inlined in (from_code, from_source):
        assert {name: inlined.get(name) for name in constants} == constants
        assert {n for n, v in inlined.items() if callable(v)} == {n for n, v in vars(cni_common).items() if callable(v)}
    # The fast path inlined beside it imports those values rather than holding its own.
    fast = codes["flock.cni_fastpath"]
    assert "flock.cni_common" in fast.co_names
    assert cni_common.SUPPORTED_VERSIONS not in fast.co_consts and cni_common.OPS not in fast.co_consts


def test_the_fast_path_loads_nothing_but_the_leaf():
    """Under ``python3 -I -S`` (the bundle's interpreter), importing the fast path loads no module
    beyond flock.cni_common and itself (the bundle's start-up cost stays a bare interpreter's)."""
    root = str(Path(flock.__file__).parent.parent)
    probe = (
        f"import sys; before = set(sys.modules); sys.path.insert(0, {root!r}); import flock.cni_fastpath; "
        "print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(["flock", "flock.cni_common", "flock.cni_fastpath"])


@pytest.mark.parametrize(
    "data",
    [b'{"a": [1, 2.5, -0.0, 1e400, NaN, true, null, "\\u00e9\\ud800"]}', b" \n{}\r\n", b"[]", b'"x"', b"12",
     b"{", b"{} x", b"\xef\xbb\xbf{}", b"", b"[" * 5000 + b"]" * 5000, b"\xff"],
)  # fmt: skip
def test_fast_loads_is_json_loads_or_none(data):
    try:
        expected = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        assert fastpath.loads(data) is None
    else:
        assert repr(fastpath.loads(data)) == repr(expected)


def test_bundle_runs_isolated_without_flock_on_sys_path(tmp_path):
    dest = tmp_path / "flock"
    build_shim(dest)
    probe = run_plugin([sys.executable, "-I", "-S", "-c", "import flock"], "VERSION", b"", tmp_path)
    assert probe.status != 0 and "No module named 'flock'" in probe.stderr
    out = run_plugin([sys.executable, "-I", "-S", str(dest)], "VERSION", {"cniVersion": "0.4.0"}, tmp_path)
    assert out.status == 0, out.stderr
    assert out.json == {"cniVersion": "0.4.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}


def test_a_python_of_another_version_runs_the_inlined_source(tmp_path, pod_netns):
    """A host python whose magic number is not the builder's compiles flock.cni_common and the fast
    path from their source in the bundle: the same answers, fast path and hand-over alike."""
    dest = tmp_path / "flock"
    build_shim(dest)
    magic = f'bytes.fromhex("{importlib.util.MAGIC_NUMBER.hex()}")'
    script = dest.read_text()
    assert script.count(magic) == 1
    dest.write_text(script.replace(magic, 'bytes.fromhex("00000d0a")'))
    argv = [sys.executable, "-I", "-S", str(dest)]
    out = run_plugin(argv, "VERSION", {"cniVersion": "0.4.0"}, tmp_path)
    assert out.status == 0, out.stderr
    assert out.json == {"cniVersion": "0.4.0", "supportedVersions": list(cni_common.SUPPORTED_VERSIONS)}
    sock = tmp_path / "run" / "flock.sock"  # no agent: ADD goes to the full shim, which answers 11
    out = run_plugin(argv, "ADD", cfg(sock), tmp_path, **pod_env(CNI_NETNS=pod_netns))
    assert (out.status, out.code, out.json["msg"]) == (1, 11, "flock-agent is not reachable"), out.stderr


def test_rebuild_replaces_atomically(tmp_path):
    dest = tmp_path / "flock"
    dest.write_text("old")
    build_shim(dest, python="/usr/bin/python3 -IS")
    assert dest.read_bytes().startswith(b"#!/usr/bin/python3 -IS\n")
    assert sorted(os.listdir(tmp_path)) == ["flock"]


def test_version_is_local_and_lenient(shim, down_socket, tmp_path):
    out = run_plugin(shim, "VERSION", b"", tmp_path)
    assert out.status == 0 and out.json["cniVersion"] == "1.1.0"


@pytest.mark.parametrize(
    "command, config, env, code, fragment",
    [
        ("ADD", {"cniVersion": "0.2.0"}, pod_env(), 1, "cniVersion='0.2.0'"),
        ("ADD", {"name": "x"}, pod_env(), 1, "cniVersion=None"),
        ("ADD", b"{not json", pod_env(), 6, "stdin"),
        ("ADD", b"[]", pod_env(), 6, "list"),
        (
            "ADD",
            {"cniVersion": "1.0.0"},
            {k: v for k, v in pod_env().items() if k != "CNI_CONTAINERID"},
            4,
            "CNI_CONTAINERID",
        ),
        ("CHECK", {"cniVersion": "1.0.0"}, pod_env(CNI_NETNS=""), 4, "CNI_NETNS"),
        ("DEL", {"cniVersion": "1.0.0"}, pod_env(CNI_IFNAME=""), 4, "CNI_IFNAME"),
        ("ADD", {"cniVersion": "1.0.0"}, pod_env(container_id="../etc/x"), 4, "'../etc/x'"),
        ("FROB", {"cniVersion": "1.0.0"}, pod_env(), 4, "CNI_COMMAND='FROB'"),
        ("ADD", {"cniVersion": "1.0.0", "socket": "relative.sock"}, pod_env(), 7, "socket='relative.sock'"),
        ("ADD", {"cniVersion": "1.0.0", "rpcTimeout": 0}, pod_env(), 7, "rpcTimeout=0"),
    ],
)
def test_invalid_invocations_fail_before_dialling(shim, tmp_path, command, config, env, code, fragment):
    out = run_plugin(shim, command, config, tmp_path, **env)
    assert out.status == 1
    err = out.json
    assert set(err) == {"cniVersion", "code", "msg", "details"}
    assert err["code"] == code
    assert fragment in err["details"]
    assert not (tmp_path / "pending-deletes").exists()


@pytest.mark.parametrize("command, code", [("ADD", 11), ("CHECK", 11), ("GC", 11), ("STATUS", 50)])
def test_agent_down(shim, down_socket, tmp_path, pod_netns, command, code):
    out = run_plugin(shim, command, cfg(down_socket), tmp_path, **pod_env(CNI_NETNS=pod_netns))
    assert out.status == 1
    assert out.code == code
    assert out.json["msg"] == "flock-agent is not reachable"
    assert str(down_socket) in out.json["details"]


def test_del_with_agent_down_is_recorded_and_succeeds(shim, down_socket, tmp_path):
    env = pod_env("deadbeef02", **journal(down_socket))
    out = run_plugin(shim, "DEL", cfg(down_socket, version="0.4.0", big="x" * 100_000), tmp_path, **env)
    assert out.status == 0 and out.stdout == ""
    pending = down_socket.parent / "pending-deletes"
    assert os.listdir(pending) == ["deadbeef02.json"]
    assert stat.S_IMODE(pending.stat().st_mode) == 0o700
    raw = (pending / "deadbeef02.json").read_bytes()
    assert raw.endswith(b"\n")
    recorded = json.loads(raw)
    assert recorded["op"] == "DEL" and recorded["containerID"] == "deadbeef02"
    # Small and always replayable (by any agent): version 1, no configuration body, no fd.
    assert recorded["version"] == 1 and "netnsFd" not in recorded
    assert recorded["config"] == {"cniVersion": "0.4.0"}
    assert len(raw) < 1024
    assert recorded["args"] == "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web-0"


def test_journal_is_never_beside_the_socket_the_request_names(shim, tmp_path):
    # The configuration names a socket under a directory of its choosing (even "/"):
    # the shim journals only in its own directory and creates nothing there.
    own = tmp_path / "own" / "pending-deletes"
    for sock in (tmp_path / "attacker" / "flock.sock", "/flock-no-such.sock"):
        out = run_plugin(shim, "DEL", cfg(sock), tmp_path, **pod_env("deadbeef03", FLOCK_PENDING_DELETES=str(own)))
        assert out.status == 0, out.stdout
    assert not (tmp_path / "attacker").exists() and not os.path.exists("/pending-deletes")
    assert os.listdir(own) == ["deadbeef03.json"]


def test_del_that_cannot_be_recorded_fails_with_5(shim, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = run_plugin(shim, "DEL", cfg(blocker / "flock.sock"), tmp_path, **pod_env(**journal(blocker / "x")))
    assert out.status == 1 and out.code == 5
    assert "pending-deletes" in out.json["details"]


def test_silent_agent_is_bounded_by_the_call_timeout(shim, tmp_path, pod_netns):
    path = tmp_path / "silent.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(8)  # accepts into the backlog, never answers
        add = run_plugin(shim, "ADD", cfg(path, rpcTimeout=0.3), tmp_path, **pod_env(CNI_NETNS=pod_netns))
        dele = run_plugin(shim, "DEL", cfg(path, rpcTimeout=0.3), tmp_path, **pod_env("silent03", **journal(path)))
    assert add.code == 11 and "no reply" in add.json["details"]
    assert dele.status == 0
    assert (tmp_path / "pending-deletes" / "silent03.json").exists()


def test_garbage_reply_is_6(shim, tmp_path):
    path = tmp_path / "liar.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(8)
        import threading

        def answer():
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"this is not json\n")

        t = threading.Thread(target=answer)
        t.start()
        out = run_plugin(shim, "STATUS", cfg(path), tmp_path)
        t.join()
    assert out.code == 6 and "not valid JSON" in out.json["msg"]


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda d: str(d / ("n" * 300)), "File name too long"),
        (lambda d: _symlink_loop(d), "Too many levels of symbolic links"),
        (lambda d: _through_file(d), "Not a directory"),
        (lambda d: _plain_file(d), "not a network namespace"),
        (lambda d: _fifo(d), "not a network namespace"),
        (lambda d: "/proc/self/ns/uts", "not a network namespace"),
        (lambda d: str(d / "missing"), "No such file"),
    ],
)
@pytest.mark.parametrize("command", ["ADD", "CHECK"])
def test_add_whose_netns_cannot_be_opened_fails_at_once_with_4(shim, tmp_path, command, make, fragment):
    netns = make(tmp_path)
    sock = tmp_path / "never-dialled.sock"
    out = run_plugin(shim, command, cfg(sock), tmp_path, **pod_env(CNI_NETNS=netns))
    assert out.status == 1 and out.code == 4, out.stdout
    assert out.json["msg"] == "cannot open the network namespace"
    assert fragment in out.json["details"] and out.json["details"].startswith("CNI_NETNS=")


def test_del_whose_netns_cannot_be_opened_still_goes_ahead(shim, tmp_path):
    sock = tmp_path / "run" / "flock.sock"
    env = pod_env("deadbeef04", CNI_NETNS=_symlink_loop(tmp_path), **journal(sock))
    out = run_plugin(shim, "DEL", cfg(sock), tmp_path, **env)
    assert out.status == 0 and (sock.parent / "pending-deletes" / "deadbeef04.json").exists()


@pytest.mark.parametrize("command", ["ADD", "CHECK", "STATUS", "GC"])
def test_request_over_the_limit_is_4_naming_its_size(shim, tmp_path, pod_netns, command):
    from flock.rpc.wire import MAX_REQUEST_BYTES

    config = cfg(tmp_path / "never.sock", blob="x" * (MAX_REQUEST_BYTES + 1))
    out = run_plugin(shim, command, config, tmp_path, **pod_env(CNI_NETNS=pod_netns))
    assert out.status == 1 and out.code == 4
    assert out.json["msg"].startswith("request too large (") and f"limit {MAX_REQUEST_BYTES})" in out.json["msg"]


def test_a_4_mib_configuration_is_not_too_large(shim, tmp_path, pod_netns):
    config = cfg(tmp_path / "down.sock", blob="x" * (4 << 20))
    out = run_plugin(shim, "ADD", config, tmp_path, **pod_env(CNI_NETNS=pod_netns))
    assert out.code == 11  # dialled (nobody there), not refused for its size


@pytest.mark.parametrize("timeout", [1e-300, 0, -1, 0.05, 300.5, 1e300, "5", True, None])
def test_rpc_timeout_outside_its_range_is_7_naming_the_field(shim, tmp_path, timeout):
    out = run_plugin(shim, "DEL", cfg(tmp_path / "x.sock", rpcTimeout=timeout), tmp_path, **pod_env())
    assert out.status == 1 and out.code == 7 and out.json["details"].startswith("rpcTimeout=")
    assert not (tmp_path / "pending-deletes").exists()


@pytest.mark.parametrize("name", ["all", "default", "eth%d", ".", "..", "a/b", "a:b", "a b", "x" * 16, ""])
def test_ifname_is_validated_as_the_reference_plugins_do(shim, tmp_path, pod_netns, name):
    out = run_plugin(shim, "ADD", cfg(tmp_path / "x.sock"), tmp_path, **pod_env(CNI_NETNS=pod_netns, CNI_IFNAME=name))
    assert out.status == 1 and out.code == 4
    assert "CNI_IFNAME" in out.json["details"]
    if name:
        assert repr(name) in out.json["details"]


def test_huge_values_are_never_echoed_whole(shim, tmp_path):
    version = "9" * 100_000
    out = run_plugin(shim, "ADD", cfg(tmp_path / "x.sock", version=version), tmp_path, **pod_env())
    assert out.code == 1
    assert len(out.stdout) < 2048 and out.json["cniVersion"] == "1.1.0"
    huge_id = "a" * 100_000 + "/"
    out = run_plugin(shim, "DEL", cfg(tmp_path / "x.sock"), tmp_path, **pod_env(huge_id))
    assert out.code == 4 and len(out.stdout) < 2048


def _symlink_loop(d) -> str:
    (d / "loop").symlink_to(d / "loop")
    return str(d / "loop")


def _through_file(d) -> str:
    (d / "regular").write_text("")
    return str(d / "regular" / "ns")


def _plain_file(d) -> str:
    (d / "plain").write_text("not a namespace")
    return str(d / "plain")


def _fifo(d) -> str:
    os.mkfifo(d / "fifo")
    return str(d / "fifo")


def test_an_agent_that_speaks_only_version_1_is_asked_again_by_path(shim, tmp_path, pod_netns):
    # Mid-upgrade: the new shim meets an old agent, which answers 202 to version 2.
    path = tmp_path / "old.sock"
    seen = []
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(8)
        import threading

        def old_agent():
            for _ in range(2):
                conn, _ = listener.accept()
                with conn:
                    line = b""
                    while not line.endswith(b"\n"):
                        line += conn.recv(65536)
                    req = json.loads(line)
                    seen.append((req["version"], req.get("netnsFd")))
                    if req["version"] != 1:
                        err = {"code": 202, "msg": "incompatible flock protocol version", "details": "speaks 1"}
                        conn.sendall(json.dumps({"error": err}).encode() + b"\n")
                    else:
                        conn.sendall(b'{"result": {"cniVersion": "1.1.0", "ips": []}}\n')

        t = threading.Thread(target=old_agent)
        t.start()
        out = run_plugin(shim, "ADD", cfg(path), tmp_path, **pod_env(CNI_NETNS=pod_netns))
        t.join(10)
    assert out.status == 0, out.stdout
    assert seen == [(2, True), (1, None)]


@pytest.mark.parametrize("version", ["0.4.0", "1.1.0"])
def test_a_successful_add_imports_nothing_beyond_the_fast_path(shim, tmp_path, pod_netns, version):
    # The fast path converts the agent's result itself: no embedded module is
    # unpacked, no flock.* module imported (-X importtime lists every import).
    path = tmp_path / "agent.sock"
    result = {"cniVersion": "1.1.0", "ips": [{"address": "2001:db8::5/128", "gateway": "fe80::1", "interface": 1}]}
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(1)
        import threading

        def agent():
            conn, _ = listener.accept()
            with conn:
                line = b""
                while not line.endswith(b"\n"):
                    line += conn.recv(65536)
                conn.sendall(json.dumps({"result": result}).encode() + b"\n")

        t = threading.Thread(target=agent)
        t.start()
        out = run_plugin(
            [sys.executable, "-I", "-S", "-X", "importtime", *shim],
            "ADD",
            cfg(path, version),
            tmp_path,
            **pod_env(CNI_NETNS=pod_netns),
        )
        t.join(10)
    assert out.status == 0, out.stderr
    assert json.loads(out.stdout) == fastpath.convert_result(result, version)
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert imported and not [m for m in imported if m.startswith("flock") or m in ("zlib", "binascii", "json")]
