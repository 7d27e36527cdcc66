"""flock-install-cni: put the CNI plugin and its network configuration on the node.

Runs as the DaemonSet's init container with the host's CNI directories and the
host's root (read-only) mounted.  It

1. finds the host's ``python3`` through the host-root mount, because the shim
   runs on the host with the host's interpreter, not in this container;
2. installs the shim as one executable file, ``<bin dir>/flock``, whose
   shebang names that interpreter;
3. writes ``<conf dir>/01-flock.conflist`` (type ``flock``, the agent's
   socket path) and warns about other configurations the runtime would pick
   first.  By default the list says ``"cniVersion": "1.0.0"`` and
   ``"cniVersions": ["0.4.0", "1.0.0", "1.1.0"]``: libcni ≥ 1.2 (containerd
   2.x, CRI-O) negotiates the highest version both sides speak (1.1.0: STATUS
   and GC), older libcni (containerd 1.6/1.7, podman 4) ignores the list and
   uses 1.0.0.  ``--cni-version`` pins one version (no list);
4. with ``--podman-network NAME``, also writes ``<conf dir>/NAME.conflist``,
   the same plugin under the network name podman's ``--network`` takes.

Only capabilities flock implements are declared: ``portMappings`` (hostPort,
programmed by the agent in its own nftables table); not ``bandwidth``, ``ips``
or ``mac``, so a runtime asked for one of those knows this network does not
provide it.

Both files are replaced atomically and only when their content changes, so a
re-run is a no-op and a runtime reading the directories never sees a partial
file.  The shim goes in before the conflist: a runtime that sees the network
configuration can always exec the plugin it names.

Error handling: nothing is retried; an :class:`InstallError` (no usable host
python, bad option) propagates to :func:`main`, which prints what the operator
has to fix and exits 1, so the kubelet shows the pod in ``Init:Error`` with the
reason in its log.  Other ``OSError``\\ s propagate unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import attrs

from flock import cni_common, logs
from flock.model import DEFAULT_NETWORK
from flock.rpc import PENDING_DELETES
from flock.rpc.cniresult import SUPPORTED_VERSIONS
from flock.shim_bundle import shim_archive

log = logging.getLogger("flock.installer")

PLUGIN_TYPE = "flock"
CONFLIST_NAME = "01-flock.conflist"
# The conflist's default: cniVersion for libcni < 1.2, cniVersions for ≥ 1.2.
CNI_VERSION = "1.0.0"
CNI_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")
DEFAULT_BIN_DIR = Path("/opt/cni/bin")
DEFAULT_CONF_DIR = Path("/etc/cni/net.d")
DEFAULT_SOCKET = cni_common.DEFAULT_SOCKET  # where the shim dials by default
DEFAULT_NETWORK_NAME = DEFAULT_NETWORK  # what rows stored before the network was recorded take
# Where Debian, Ubuntu, RHEL-likes, Flatcar-with-sysext and source builds put it.
HOST_PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
MIN_HOST_PYTHON = (3, 8)

# Runtimes (libcni, ocicni) load every *.conf, *.conflist and *.json in the conf
# dir, so a temporary file must never carry one of those suffixes.
TEMP_SUFFIX = ".flock-tmp"
RUNTIME_CONF_SUFFIXES = (".conf", ".conflist", ".json")

_MAX_SYMLINKS = 40
_NETWORK_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
_PYTHON_VERSION = re.compile(r"python(\d+)\.(\d+)$")


class InstallError(RuntimeError):
    """The node cannot take flock as configured; ``what`` says what is missing."""

    def __init__(self, what: str, remedy: str) -> None:
        self.what, self.remedy = what, remedy
        super().__init__(f"{what}. {remedy}")


@attrs.frozen
class HostPython:
    """The host's interpreter: ``path`` as the host sees it (used as the shebang)."""

    path: str
    version: tuple[int, int] | None


@attrs.frozen
class InstallConfig:
    bin_dir: Path = DEFAULT_BIN_DIR
    conf_dir: Path = DEFAULT_CONF_DIR
    socket: str = DEFAULT_SOCKET
    host_root: Path = Path("/")
    host_python: str | None = None  # None: search HOST_PYTHON_CANDIDATES
    network_name: str = DEFAULT_NETWORK_NAME
    # None: cniVersion 1.0.0 plus the negotiable cniVersions list (every runtime
    # accepts it); a version: that one only (--cni-version).
    cni_version: str | None = None
    # Also write <conf dir>/<podman_network>.conflist (podman's --network name).
    podman_network: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.cni_version is not None and self.cni_version not in SUPPORTED_VERSIONS:
            raise InstallError(
                f"--cni-version {self.cni_version!r} is not a CNI version flock speaks",
                "Use one of " + ", ".join(SUPPORTED_VERSIONS) + " (1.0.0 for runtimes on libcni older than 1.2).",
            )
        if not PurePosixPath(self.socket).is_absolute():
            raise InstallError(
                f"--socket {self.socket!r} is not an absolute path",
                "Pass the agent socket's host path, e.g. /run/flock/flock.sock.",
            )
        if not _NETWORK_NAME.fullmatch(self.network_name):
            raise InstallError(
                f"--network-name {self.network_name!r} is not a valid CNI network name",
                "Use letters, digits, '_', '.' and '-', starting with a letter or digit.",
            )
        if self.podman_network is not None and (
            not _NETWORK_NAME.fullmatch(self.podman_network) or self.podman_network == self.network_name
        ):
            raise InstallError(
                f"--podman-network {self.podman_network!r} is not a valid network name other than --network-name",
                "Use letters, digits, '_', '.' and '-', starting with a letter or digit, e.g. flock-podman.",
            )
        if self.host_python is not None and (
            not PurePosixPath(self.host_python).is_absolute() or any(c.isspace() for c in self.host_python)
        ):
            # It becomes the shebang, which the kernel splits at the first blank.
            raise InstallError(
                f"--host-python {self.host_python!r} is not an absolute path without blanks",
                "Pass the interpreter's path as the host sees it, e.g. /usr/bin/python3.",
            )


@attrs.frozen
class InstallResult:
    host_python: HostPython
    shim: Path
    shim_changed: bool
    conflist: Path
    conflist_changed: bool
    podman_conflist: Path | None = None
    shadowed_by: tuple[str, ...] = ()  # other configs the runtime would pick instead


def conflist_bytes(network_name: str, socket: str, cni_version: str | None = None) -> bytes:
    """The network configuration list, byte-stable so a re-run can compare it.

    *cni_version* None: ``cniVersion`` 1.0.0 and the ``cniVersions`` list (CNI
    1.1) for runtimes that negotiate; a version: that version alone.  The
    plugin entry declares the one capability flock implements, ``portMappings``.
    """
    doc: dict[str, object] = {"cniVersion": cni_version or CNI_VERSION}
    if cni_version is None:
        doc["cniVersions"] = list(CNI_VERSIONS)
    doc["name"] = network_name
    doc["plugins"] = [{"type": PLUGIN_TYPE, "socket": socket, "capabilities": {"portMappings": True}}]
    return (json.dumps(doc, indent=2) + "\n").encode()


def resolve_in_root(root: Path, host_path: str) -> PurePosixPath | None:
    """Follow *host_path* inside the host tree mounted at *root*.

    Symlinks are resolved as the host would, so an absolute link such as
    ``/usr/bin/python3 -> /etc/alternatives/python3`` stays under *root*
    instead of escaping into the container.  Returns the host path of the
    final target, or None when any part is missing or the links loop.
    """
    pending = list(PurePosixPath(host_path).parts[1:])
    resolved = PurePosixPath("/")
    links = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            resolved = resolved.parent
            continue
        candidate = resolved / part
        on_disk = root / candidate.relative_to("/")
        if on_disk.is_symlink():
            links += 1
            if links > _MAX_SYMLINKS:
                return None
            target = PurePosixPath(os.readlink(on_disk))
            if target.is_absolute():
                resolved = PurePosixPath("/")
                pending = list(target.parts[1:]) + pending
            else:
                pending = list(target.parts) + pending
            continue
        if not os.path.lexists(on_disk):
            return None
        resolved = candidate
    return resolved


def find_host_python(root: Path, candidates: Sequence[str] = HOST_PYTHON_CANDIDATES) -> HostPython:
    """The first candidate that is an executable regular file on the host.

    The version comes from the resolved file name (``python3.11``); when the
    name does not tell, it is None and the install goes ahead with a warning.
    Raises InstallError when no candidate is usable or the version is older
    than MIN_HOST_PYTHON.
    """
    for path in candidates:
        target = resolve_in_root(root, path)
        if target is None:
            continue
        st = (root / target.relative_to("/")).stat()
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            continue
        match = _PYTHON_VERSION.search(target.name)
        version = (int(match[1]), int(match[2])) if match else None
        if version is not None and version < MIN_HOST_PYTHON:
            need = ".".join(map(str, MIN_HOST_PYTHON))
            raise InstallError(
                f"the host's {path} is Python {version[0]}.{version[1]} ({target}); the flock CNI plugin needs {need} or newer",
                "Install a newer python3 on the node, or point --host-python at one.",
            )
        return HostPython(path=path, version=version)
    looked = ", ".join(candidates)
    raise InstallError(
        f"the host has no python3: looked for {looked} under the host root {root}",
        "The flock CNI plugin runs on the node itself with the node's Python 3.8+ "
        "(standard library only). Install it on the node (Debian/Ubuntu: apt-get install "
        "python3-minimal; RHEL-likes: dnf install python3), or pass --host-python with "
        "its path on the host; check that the host root is mounted at --host-root.",
    )


def write_atomic(path: Path, data: bytes, mode: int) -> bool:
    """Make *path* hold *data* with *mode*; return whether anything was written.

    Unchanged content and mode → nothing is touched.  Otherwise the data goes
    to a temporary file in the same directory (named ``.<name>.*.flock-tmp``,
    which no runtime loads), is fsynced and renamed over *path*, and the
    directory is fsynced, so readers see the old file or the new one, never a
    part.  The temporary file is removed if anything fails.
    """
    with contextlib.suppress(FileNotFoundError):
        if stat.S_IMODE(path.stat().st_mode) == mode and path.read_bytes() == data:
            return False
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


def shim_bytes(python: str, pending_deletes: str | None = None) -> bytes:
    """The shim as one file: a shebang running the host's *python* with ``-IS``
    (isolated from PYTHON* variables and site-packages: the shim needs only
    the standard library, and skipping ``site`` saves start-up time on every
    pod start), then the zipapp.  Byte-identical for identical sources, so an
    unchanged shim is not rewritten."""
    return shim_archive(prefix=f"#!{python} -IS\n".encode(), pending_deletes=pending_deletes)


def configs_loaded_before(conf_dir: Path, name: str) -> list[str]:
    """Network configurations in *conf_dir* that a runtime would pick before *name*.

    containerd and CRI-O use the first file, in name order, with a runtime
    suffix; one sorting before ours means pods do not get flock at all.
    """
    return sorted(
        entry.name
        for entry in os.scandir(conf_dir)
        if entry.name < name and entry.name.endswith(RUNTIME_CONF_SUFFIXES) and entry.is_file()
    )


def install(config: InstallConfig) -> InstallResult:
    """Install the shim, then the conflist (see the module docstring)."""
    python = find_host_python(config.host_root, (config.host_python,) if config.host_python else HOST_PYTHON_CANDIDATES)
    if python.version is None:
        log.warning(
            "could not tell the host python's version from its file name; it must be 3.8 or newer",
            extra={"python": python.path},
        )
    config.bin_dir.mkdir(parents=True, exist_ok=True)
    config.conf_dir.mkdir(parents=True, exist_ok=True)

    shim = config.bin_dir / PLUGIN_TYPE
    # The shim journals DELs beside the agent's socket as the installer knows
    # it (flock's own run directory), never beside a socket a request names.
    journal = str(PurePosixPath(config.socket).parent / PENDING_DELETES)
    shim_changed = write_atomic(shim, shim_bytes(python.path, journal), 0o755)
    conflist = config.conf_dir / CONFLIST_NAME
    conflist_changed = write_atomic(
        conflist, conflist_bytes(config.network_name, config.socket, config.cni_version), 0o644
    )
    podman_conflist = None
    if config.podman_network is not None:
        # podman (CNI backend) loads every list in its conf dir and selects by
        # name; a file name after 01-flock keeps CRI runtimes on the main one.
        podman_conflist = config.conf_dir / f"{config.podman_network}.conflist"
        write_atomic(podman_conflist, conflist_bytes(config.podman_network, config.socket, config.cni_version), 0o644)
    shadowing = configs_loaded_before(config.conf_dir, CONFLIST_NAME)
    if shadowing:
        log.warning(
            "the runtime uses the first network configuration by name, and these come before flock's: "
            "remove them (or the other CNI) for pods to get flock addresses",
            extra={"conf_dir": str(config.conf_dir), "before": shadowing},
        )
    result = InstallResult(python, shim, shim_changed, conflist, conflist_changed, podman_conflist, tuple(shadowing))
    log.info(
        "flock CNI installed",
        extra={
            "python": python.path,
            "shim": str(shim),
            "shim_changed": shim_changed,
            "conflist": str(conflist),
            "conflist_changed": conflist_changed,
            "podman_conflist": str(podman_conflist) if podman_conflist else None,
        },
    )
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="flock-install-cni", description="Install the flock CNI plugin and its network configuration on this node."
    )
    p.add_argument(
        "--cni-bin-dir",
        type=Path,
        default=DEFAULT_BIN_DIR,
        help="where the runtime looks for plugins (default %(default)s)",
    )
    p.add_argument(
        "--cni-conf-dir",
        type=Path,
        default=DEFAULT_CONF_DIR,
        help="where the runtime reads network configurations (default %(default)s)",
    )
    p.add_argument(
        "--socket", default=DEFAULT_SOCKET, help="the agent's socket, as the host sees it (default %(default)s)"
    )
    p.add_argument(
        "--host-root",
        type=Path,
        default=Path("/"),
        help="where the host's / is mounted, to find its python3 (default %(default)s)",
    )
    p.add_argument(
        "--host-python",
        default=None,
        help="the host's python3 as the host sees it (default: search " + ", ".join(HOST_PYTHON_CANDIDATES) + ")",
    )
    p.add_argument("--network-name", default=DEFAULT_NETWORK_NAME, help="the CNI network name (default %(default)s)")
    p.add_argument(
        "--cni-version",
        default=None,
        help="pin the conflist to this cniVersion (default: cniVersion "
        + CNI_VERSION
        + " plus cniVersions "
        + ",".join(CNI_VERSIONS)
        + ", which every runtime accepts)",
    )
    p.add_argument(
        "--podman-network",
        default=None,
        metavar="NAME",
        help="also write NAME.conflist, a flock network for `podman run --network NAME` (podman's CNI backend)",
    )
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(level=args.log_level, fmt=args.log_format)
    try:
        install(
            InstallConfig(
                bin_dir=args.cni_bin_dir,
                conf_dir=args.cni_conf_dir,
                socket=args.socket,
                host_root=args.host_root,
                host_python=args.host_python,
                network_name=args.network_name,
                cni_version=args.cni_version,
                podman_network=args.podman_network,
            )
        )
    except InstallError as e:
        log.error("cannot install flock CNI", extra={"what": e.what, "remedy": e.remedy})
        print(f"flock-install-cni: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
