"""flock-install-cni against temporary CNI dirs and a made-up host root."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import attrs
import pytest

from flock import installer
from flock.installer import InstallConfig, InstallError


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    logging.getLogger().handlers.clear()


def make_host(root: Path, python: str = "python3.11", link: str | None = None) -> Path:
    """A host tree with /usr/bin/python3 -> <link or python> and an executable <python>."""
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    target = bin_dir / python
    target.write_text("#!/bin/false\n")
    target.chmod(0o755)
    (bin_dir / "python3").symlink_to(link or python)
    return root


@pytest.fixture
def node(tmp_path: Path) -> InstallConfig:
    # The shebang names the host's /usr/bin/python3, which on this machine
    # (and CI's) is a real Python 3.8+, so the installed shim really runs.
    return InstallConfig(
        bin_dir=tmp_path / "opt/cni/bin",
        conf_dir=tmp_path / "etc/cni/net.d",
        socket=str(tmp_path / "run/flock/flock.sock"),
        host_root=make_host(tmp_path / "host"),
    )


def network_config(config: InstallConfig) -> dict:
    """What a runtime passes the plugin on stdin: the conflist's top level plus the plugin entry."""
    conflist = json.loads((config.conf_dir / installer.CONFLIST_NAME).read_text())
    (plugin,) = conflist["plugins"]
    return {"cniVersion": conflist["cniVersion"], "name": conflist["name"], **plugin}


def run_shim(config: InstallConfig, command: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(config.bin_dir / "flock")],
        input=json.dumps(network_config(config)),
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": command, "CNI_PATH": str(config.bin_dir), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_install_writes_one_executable_shim_and_the_conflist(node):
    result = installer.install(node)
    assert result.shim_changed and result.conflist_changed
    assert result.host_python == installer.HostPython("/usr/bin/python3", (3, 11))

    shim = node.bin_dir / "flock"
    assert result.shim == shim and shim.is_file() and not shim.is_symlink()
    assert shim.stat().st_mode & 0o777 == 0o755
    assert shim.read_bytes().startswith(b"#!/usr/bin/python3 -IS\n")
    assert sorted(p.name for p in node.bin_dir.iterdir()) == ["flock"]

    assert json.loads(result.conflist.read_text()) == {
        "cniVersion": "1.0.0",
        "cniVersions": ["0.4.0", "1.0.0", "1.1.0"],
        "name": "flock",
        "plugins": [{"type": "flock", "socket": str(node.socket), "capabilities": {"portMappings": True}}],
    }
    assert result.conflist == node.conf_dir / "01-flock.conflist"
    assert sorted(p.name for p in node.conf_dir.iterdir()) == ["01-flock.conflist"]


def test_installed_shim_loads_the_conflist_and_answers_version(node):
    installer.install(node)
    out = run_shim(node, "VERSION")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["cniVersion"] == "1.0.0"
    assert "1.1.0" in answer["supportedVersions"]


def test_installed_shim_del_succeeds_with_the_agent_unreachable(node):
    # Nothing listens on the conflist's socket: DESIGN says DEL is queued and succeeds.
    installer.install(node)
    Path(node.socket).parent.mkdir(parents=True)
    out = run_shim(node, "DEL", CNI_CONTAINERID="c0ffee", CNI_NETNS="/var/run/netns/gone", CNI_IFNAME="eth0")
    assert out.returncode == 0, (out.stdout, out.stderr)
    # Queued in the run directory of the socket the installer was given (baked
    # into the shim, never read from the request), small: no configuration body.
    queued = json.loads((Path(node.socket).parent / "pending-deletes" / "c0ffee.json").read_text())
    assert queued["op"] == "DEL" and queued["containerID"] == "c0ffee"
    assert set(queued["config"]) == {"cniVersion"}


def test_installed_shim_journals_in_its_own_directory_not_beside_a_requested_socket(node, tmp_path):
    installer.install(node)
    Path(node.socket).parent.mkdir(parents=True)
    elsewhere = tmp_path / "attacker" / "flock.sock"
    conf = json.dumps({"cniVersion": "1.0.0", "name": "x", "type": "flock", "socket": str(elsewhere)})
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c0ffee", "CNI_IFNAME": "eth0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(node.bin_dir / "flock")], input=conf.encode(), env=env, capture_output=True)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert not (tmp_path / "attacker").exists()
    assert (Path(node.socket).parent / "pending-deletes" / "c0ffee.json").exists()


def test_second_install_changes_nothing(node):
    installer.install(node)
    before = {
        p: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in (node.bin_dir / "flock", node.conf_dir / installer.CONFLIST_NAME)
    }
    again = installer.install(node)
    assert (again.shim_changed, again.conflist_changed) == (False, False)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in before} == before


def test_install_rewrites_only_what_changed(node):
    installer.install(node)
    moved = installer.install(InstallConfig(node.bin_dir, node.conf_dir, "/run/other/flock.sock", node.host_root))
    # The shim carries the journal directory derived from the socket: both change.
    assert (moved.shim_changed, moved.conflist_changed) == (True, True)
    assert json.loads(moved.conflist.read_text())["plugins"][0]["socket"] == "/run/other/flock.sock"

    moved.conflist.write_text("{}")  # someone edited it by hand
    (node.bin_dir / "flock").chmod(0o700)
    repaired = installer.install(node)
    assert (repaired.shim_changed, repaired.conflist_changed) == (True, True)
    assert json.loads(repaired.conflist.read_text())["plugins"][0]["socket"] == node.socket
    assert (node.bin_dir / "flock").stat().st_mode & 0o777 == 0o755


def test_configs_the_runtime_would_pick_first_are_reported(node, capsys):
    node.conf_dir.mkdir(parents=True)
    for name in ("00-other.conflist", "00-notes.txt", ".00-hidden.flock-tmp", "99-loopback.conf"):
        (node.conf_dir / name).write_text("{}")
    argv = [
        f"--cni-bin-dir={node.bin_dir}",
        f"--cni-conf-dir={node.conf_dir}",
        f"--socket={node.socket}",
        f"--host-root={node.host_root}",
        "--log-format=json",
    ]
    assert installer.main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    (warning,) = [r for r in records if r["level"] == "warning"]
    assert warning["before"] == ["00-other.conflist"]
    assert installer.install(node).shadowed_by == ("00-other.conflist",)
    (node.conf_dir / "00-other.conflist").unlink()
    assert installer.install(node).shadowed_by == ()


def test_missing_host_python_is_a_clear_failure(tmp_path, capsys):
    host = tmp_path / "host"
    (host / "usr/bin").mkdir(parents=True)
    argv = [
        f"--cni-bin-dir={tmp_path / 'bin'}",
        f"--cni-conf-dir={tmp_path / 'net.d'}",
        f"--host-root={host}",
        "--log-format=text",
    ]
    assert installer.main(argv) == 1
    err = capsys.readouterr().err
    assert "the host has no python3" in err
    assert "/usr/bin/python3, /usr/local/bin/python3, /bin/python3" in err
    assert str(host) in err
    assert "Install it on the node" in err
    assert not (tmp_path / "bin").exists() and not (tmp_path / "net.d").exists()


def test_console_script_reports_missing_python_and_exits_non_zero(tmp_path):
    script = Path(sys.executable).parent / "flock-install-cni"
    out = subprocess.run(
        [
            str(script),
            f"--cni-bin-dir={tmp_path / 'bin'}",
            f"--cni-conf-dir={tmp_path / 'net.d'}",
            f"--host-root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert "flock-install-cni: the host has no python3" in out.stderr


def test_host_python_too_old_is_refused(tmp_path):
    host = make_host(tmp_path / "host", python="python3.6")
    with pytest.raises(InstallError, match=r"Python 3\.6 .*needs 3\.8 or newer"):
        installer.find_host_python(host)


def test_non_executable_host_python_is_not_used(tmp_path):
    host = make_host(tmp_path / "host")
    (host / "usr/bin/python3.11").chmod(0o644)
    with pytest.raises(InstallError, match="the host has no python3"):
        installer.find_host_python(host)


def test_host_symlinks_resolve_inside_the_host_root(tmp_path):
    # /usr/bin/python3 -> /etc/alternatives/python3 -> /usr/local/bin/python3.12, all on the host.
    host = tmp_path / "host"
    (host / "usr/local/bin").mkdir(parents=True)
    (host / "usr/bin").mkdir(parents=True)
    (host / "etc/alternatives").mkdir(parents=True)
    real = host / "usr/local/bin/python3.12"
    real.write_text("")
    real.chmod(0o755)
    (host / "etc/alternatives/python3").symlink_to("/usr/local/bin/python3.12")
    (host / "usr/bin/python3").symlink_to("/etc/alternatives/python3")
    assert installer.find_host_python(host) == installer.HostPython("/usr/bin/python3", (3, 12))


def test_absolute_symlink_does_not_escape_to_the_container(tmp_path):
    # The link's target exists in this process's root (this machine's python),
    # but not on the "host": there is no python3 on the host.
    host = tmp_path / "host"
    (host / "usr/bin").mkdir(parents=True)
    (host / "usr/bin/python3").symlink_to(os.path.realpath(sys.executable))
    assert installer.resolve_in_root(host, "/usr/bin/python3") is None
    with pytest.raises(InstallError, match="the host has no python3"):
        installer.find_host_python(host)


def test_symlink_loop_is_no_python(tmp_path):
    host = tmp_path / "host"
    (host / "usr/bin").mkdir(parents=True)
    (host / "usr/bin/python3").symlink_to("python3.x")
    (host / "usr/bin/python3.x").symlink_to("/usr/bin/python3")
    with pytest.raises(InstallError, match="the host has no python3"):
        installer.find_host_python(host)


def test_explicit_host_python(tmp_path, node):
    host = make_host(tmp_path / "other-host", python="python3.13")
    (host / "opt/py/bin").mkdir(parents=True)
    (host / "opt/py/bin/python3").symlink_to("/usr/bin/python3.13")
    config = InstallConfig(node.bin_dir, node.conf_dir, node.socket, host, host_python="/opt/py/bin/python3")
    result = installer.install(config)
    assert result.host_python == installer.HostPython("/opt/py/bin/python3", (3, 13))
    assert (node.bin_dir / "flock").read_bytes().startswith(b"#!/opt/py/bin/python3 -IS\n")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("socket", "run/flock.sock", "--socket 'run/flock.sock' is not an absolute path"),
        ("network_name", "-flock", "--network-name '-flock' is not a valid CNI network name"),
        ("network_name", "flock\n", "--network-name 'flock\\n' is not a valid CNI network name"),
        ("host_python", "python3", "--host-python 'python3' is not an absolute path without blanks"),
        (
            "host_python",
            "/opt/my python/python3",
            "--host-python '/opt/my python/python3' is not an absolute path without blanks",
        ),
    ],
)
def test_bad_options_are_refused(field, value, message):
    with pytest.raises(InstallError, match=re.escape(message)):
        InstallConfig(**{field: value})


def test_temporary_names_are_never_read_by_a_runtime(tmp_path):
    assert not installer.TEMP_SUFFIX.endswith(installer.RUNTIME_CONF_SUFFIXES)
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    target = conf_dir / installer.CONFLIST_NAME
    versions = [installer.conflist_bytes("flock", f"/run/flock{i}/flock.sock") * (1 + 200 * i) for i in range(2)]
    installer.write_atomic(target, versions[0], 0o644)

    names_seen: set[str] = set()
    bad_reads: list[str] = []
    done = threading.Event()

    def runtime() -> None:
        # Reads what libcni would: every *.conf, *.conflist, *.json, as often as it can.
        while not done.is_set():
            for entry in os.scandir(conf_dir):
                names_seen.add(entry.name)
                if entry.name.endswith(installer.RUNTIME_CONF_SUFFIXES):
                    try:
                        data = Path(entry.path).read_bytes()
                    except FileNotFoundError:
                        continue
                    if data not in versions:
                        bad_reads.append(f"{entry.name}: {len(data)} bytes")

    reader = threading.Thread(target=runtime)
    reader.start()
    try:
        for i in range(200):
            assert installer.write_atomic(target, versions[(i + 1) % 2], 0o644)
    finally:
        done.set()
        reader.join()
    assert bad_reads == []
    strays = {n for n in names_seen if n != installer.CONFLIST_NAME}
    assert all(n.startswith(".") and n.endswith(installer.TEMP_SUFFIX) for n in strays), strays
    assert sorted(p.name for p in conf_dir.iterdir()) == [installer.CONFLIST_NAME]


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / installer.CONFLIST_NAME
    installer.write_atomic(target, b"old\n", 0o644)

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        installer.write_atomic(target, b"new\n", 0o644)
    assert target.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == [installer.CONFLIST_NAME]


def test_cni_version_is_chosen_and_checked(tmp_path):
    pinned = json.loads(installer.conflist_bytes("flock", "/run/flock/flock.sock", "1.1.0"))
    assert pinned["cniVersion"] == "1.1.0" and "cniVersions" not in pinned
    default = json.loads(installer.conflist_bytes("flock", "/run/flock/flock.sock"))
    # libcni < 1.2 reads cniVersion; ≥ 1.2 negotiates from cniVersions.
    assert default["cniVersion"] == "1.0.0" and default["cniVersions"] == ["0.4.0", "1.0.0", "1.1.0"]
    assert default["plugins"][0]["capabilities"] == {"portMappings": True}  # the one flock implements
    with pytest.raises(installer.InstallError) as info:
        installer.InstallConfig(cni_version="0.2.0")
    assert "0.2.0" in str(info.value) and "1.0.0" in info.value.remedy


def test_podman_network_gets_its_own_conflist(node):
    result = installer.install(attrs.evolve(node, podman_network="flock-podman"))
    assert result.podman_conflist == node.conf_dir / "flock-podman.conflist"
    podman = json.loads(result.podman_conflist.read_text())
    main = json.loads(result.conflist.read_text())
    assert podman == {**main, "name": "flock-podman"}
    assert result.shadowed_by == ()  # sorts after 01-flock.conflist: CRI runtimes keep the main list
    with pytest.raises(installer.InstallError, match="--podman-network"):
        InstallConfig(podman_network="flock")  # same name as the main network
    with pytest.raises(installer.InstallError, match="--podman-network"):
        InstallConfig(podman_network="../x")
