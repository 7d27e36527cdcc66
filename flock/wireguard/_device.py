"""One WireGuard interface in a node's network namespace: the kernel module's or wireguard-go's.

One code path for both (DESIGN: kernel module in production, wireguard-go in the lab and CI):

- **create**: ``ip link add NAME type wireguard``; where the kernel has no WireGuard (``Unknown
  device type``) and the choice allows it, ``wireguard-go NAME`` instead, in the node's namespace.
- **configure and read**: ``wg set`` and ``wg show NAME dump``, always.  wireguard-tools speaks
  generic netlink to the kernel module and the UAPI socket (``/var/run/wireguard/NAME.sock``) to
  wireguard-go: the same commands, the same output, for both.  (UAPI alone cannot drive the kernel
  module, and netlink alone cannot drive wireguard-go: only ``wg`` covers both, and it is the
  reference implementation, on every node that has WireGuard.)
- **delete**: ``ip link del NAME``, for both: wireguard-go exits when its TUN device goes.

wireguard-go runs as a daemon (its default: the first process forks the device's process and exits
once the TUN device and the UAPI socket exist), not as a child of the agent: the interface lives as
long as the node wants it, across agent restarts, exactly as a kernel interface does.  Nobody
supervises the process: :meth:`WireGuardDevice.ensure` finds the interface gone if it died and
creates it again, and the caller configures it again.  Its UAPI socket lives in the file system,
not the namespace: one machine cannot have two wireguard-go devices of one name even in two
namespaces (the lab gives each node its own name); ``ensure`` checks that the socket's process is in
this namespace (its socket table) and refuses one that is not.

Secrets: a private key reaches ``wg`` on its stdin (``private-key /dev/stdin``), never in argv or the
environment; ``wg show dump`` prints the private key, which is dropped as the first line is parsed;
``wg``'s error output is redacted of the key before it goes into an error.

Blocking work runs in subprocesses (trio.run_process) or ``trio.to_thread``; errors propagate as
:class:`DeviceError` (and subclasses) to the caller, which owns retrying.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import logging
import os
import shutil
import socket
from collections.abc import Iterable, Mapping

import attrs
import trio

from flock.netns import call_in_netns, netns_path
from flock.wireguard._keys import PrivateKey, PublicKey
from flock.wireguard._model import Endpoint, IPNetwork, Peer, network_order

log = logging.getLogger("flock.wireguard")

SOCKET_DIR = "/var/run/wireguard"  # wireguard-go's and wg's UAPI directory (compiled into both)
MAX_NAME = 15  # IFNAMSIZ - 1


def _pid_holding(inode: int) -> int | None:
    """The process with socket *inode* open (None: no longer any)."""
    wanted = f"socket:[{inode}]"
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == wanted for fd in fds):
                return int(pid)
        except OSError:  # gone, or a thread's view we may not read
            continue
    return None


class DeviceChoice(enum.StrEnum):
    AUTO = "auto"  # the kernel module where the kernel has it, wireguard-go else
    KERNEL = "kernel"
    USERSPACE = "userspace"


class DeviceKind(enum.StrEnum):
    KERNEL = "kernel"
    USERSPACE = "userspace"


class DeviceError(OSError):
    """A command on the device failed: *step* says which, *output* is its (redacted) error output."""

    def __init__(self, name: str, step: str, output: str, returncode: int | None = None) -> None:
        detail = f" (exit {returncode})" if returncode is not None else ""
        super().__init__(f"WireGuard device {name}: {step} failed{detail}: {output.strip() or 'no output'}")
        self.name = name
        self.step = step
        self.output = output
        self.returncode = returncode


class KernelWireGuardMissing(DeviceError):
    """The choice is the kernel module and this kernel has none."""


class NotWireGuard(DeviceError):
    """An interface of the device's name exists and is no WireGuard device of this namespace."""


@attrs.frozen
class Tools:
    """The programs the device runs (paths or names on PATH)."""

    wg: str = "wg"
    wireguard_go: str = "wireguard-go"
    ip: str = "ip"
    nsenter: str = "nsenter"

    def missing(self, choice: DeviceChoice = DeviceChoice.AUTO) -> list[str]:
        """What is not installed, each with the Debian package that has it."""
        needed = {self.wg: "wireguard-tools", self.ip: "iproute2", self.nsenter: "util-linux"}
        if choice != DeviceChoice.KERNEL:
            needed[self.wireguard_go] = "wireguard-go"
        return [f"{tool} (Debian package {package})" for tool, package in needed.items() if shutil.which(tool) is None]


@attrs.frozen
class PeerState(Peer):
    """A peer as the device has it, with its traffic: *latest_handshake* in Unix seconds (None: never)."""

    latest_handshake: int | None = None
    rx_bytes: int = 0
    tx_bytes: int = 0

    def configured(self) -> Peer:
        return Peer(self.public_key, self.endpoint, self.allowed_ips, self.persistent_keepalive)


@attrs.frozen
class DeviceState:
    """What ``wg show NAME dump`` says, without the private key (*public_key* None: no key set)."""

    public_key: PublicKey | None
    listen_port: int
    peers: Mapping[PublicKey, PeerState]

    @classmethod
    def configured(cls, public_key: PublicKey, listen_port: int, peers: Iterable[Peer]) -> DeviceState:
        """The state a device has after being given these settings (no traffic, no handshakes)."""
        return cls(
            public_key,
            listen_port,
            {p.public_key: PeerState(p.public_key, p.endpoint, p.allowed_ips, p.persistent_keepalive) for p in peers},
        )

    @classmethod
    def from_dump(cls, text: str) -> DeviceState:
        lines = text.splitlines()
        if not lines:
            raise ValueError("wg show dump: no output")
        fields = lines[0].split("\t")
        if len(fields) != 4:
            raise ValueError(f"wg show dump: the interface line has {len(fields)} fields, expected 4")
        del fields[0]  # the private key: not kept, not shown
        public = None if fields[0] == "(none)" else PublicKey.from_base64(fields[0], "wg show dump: public key")
        peers: dict[PublicKey, PeerState] = {}
        for line in lines[1:]:
            f = line.split("\t")
            if len(f) != 8:
                raise ValueError(f"wg show dump: a peer line has {len(f)} fields, expected 8")
            key = PublicKey.from_base64(f[0], "wg show dump: peer key")
            allowed = [] if f[3] == "(none)" else [ipaddress.ip_network(n) for n in f[3].split(",")]
            peers[key] = PeerState(
                public_key=key,
                endpoint=None if f[2] == "(none)" else Endpoint.parse(f[2]),
                allowed_ips=frozenset(allowed),
                persistent_keepalive=None if f[7] == "off" else int(f[7]),
                latest_handshake=int(f[4]) or None,
                rx_bytes=int(f[5]),
                tx_bytes=int(f[6]),
            )
        return cls(public, int(fields[1]), peers)


@attrs.frozen
class Change:
    """What one :meth:`WireGuardDevice.configure` changed (all empty: nothing, and ``wg set`` not run)."""

    key_set: bool = False
    port_set: bool = False
    added: tuple[PublicKey, ...] = ()
    updated: tuple[PublicKey, ...] = ()
    removed: tuple[PublicKey, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.key_set or self.port_set or self.added or self.updated or self.removed)

    def summary(self) -> dict[str, object]:
        return {
            "key_set": self.key_set,
            "port_set": self.port_set,
            "added": [str(k) for k in self.added],
            "updated": [str(k) for k in self.updated],
            "removed": [str(k) for k in self.removed],
        }


def _allowed_arg(nets: Iterable[IPNetwork]) -> str:
    return ",".join(str(n) for n in sorted(nets, key=network_order))


def plan_set(
    state: DeviceState, public_key: PublicKey, listen_port: int, peers: Iterable[Peer]
) -> tuple[list[str], Change]:
    """The ``wg set NAME …`` arguments that take *state* to the desired one, and what they change (pure).

    Minimal: a peer that is as desired is not mentioned (its session and handshake are untouched); a
    peer that differs is updated in place, only in what differs (never removed and added again); a
    peer that is not desired is removed.  Removals come first, so that allowed IPs leaving a removed
    peer (an old key) for an added one (its new key) move within the one call.  The private key, when
    it changes, is read from stdin: the caller adds ``private-key /dev/stdin`` (see *Change.key_set*)."""
    desired: dict[PublicKey, Peer] = {}
    for peer in peers:
        if peer.public_key in desired:
            raise ValueError(f"peer {peer.public_key} is desired twice")
        desired[peer.public_key] = peer
    args: list[str] = []
    port_set = state.listen_port != listen_port
    if port_set:
        args += ["listen-port", str(listen_port)]
    removed = tuple(sorted(key for key in state.peers if key not in desired))
    for key in removed:
        args += ["peer", str(key), "remove"]
    added: list[PublicKey] = []
    updated: list[PublicKey] = []
    for key in sorted(desired):
        want, have = desired[key], state.peers.get(key)
        peer_args: list[str] = []
        if want.endpoint is not None and (have is None or have.endpoint != want.endpoint):
            peer_args += ["endpoint", str(want.endpoint)]
        # A new peer starts with no allowed IPs and keepalive off: only what differs from that is written.
        if want.allowed_ips != (have.allowed_ips if have is not None else frozenset()):
            peer_args += ["allowed-ips", _allowed_arg(want.allowed_ips)]
        if want.persistent_keepalive != (have.persistent_keepalive if have is not None else None):
            peer_args += ["persistent-keepalive", str(want.persistent_keepalive or "off")]
        if have is None:
            added.append(key)
            args += ["peer", str(key), *peer_args]
        elif peer_args:
            updated.append(key)
            args += ["peer", str(key), *peer_args]
    change = Change(state.public_key != public_key, port_set, tuple(added), tuple(updated), removed)
    return args, change


@attrs.define(eq=False)
class WireGuardDevice:
    """The WireGuard interface *name* in network namespace *netns* (a path or a name under /run/netns;
    None: this process's).  *mtu*: set at every :meth:`ensure` when given."""

    name: str = attrs.field()
    netns: str | None = None
    choice: DeviceChoice = DeviceChoice.AUTO
    mtu: int | None = None
    tools: Tools = attrs.field(factory=Tools)
    _kind: DeviceKind | None = attrs.field(init=False, default=None)

    @name.validator
    def _check_name(self, attribute: attrs.Attribute, value: str) -> None:
        if not value or len(value) > MAX_NAME or "/" in value or any(c.isspace() for c in value):
            raise ValueError(f"interface name {value!r}: expected 1 to {MAX_NAME} characters, no '/' or space")

    @property
    def kind(self) -> DeviceKind | None:
        """What :meth:`ensure` found or made (None before it)."""
        return self._kind

    @property
    def socket_path(self) -> str:
        return f"{SOCKET_DIR}/{self.name}.sock"

    async def ensure(self) -> DeviceKind:
        """The interface exists, is WireGuard, and is up: adopted as it is (keys, peers, sessions kept)
        when it is there already, created (empty) when not.  Idempotent."""
        link_kind = await self._link_kind()
        created = link_kind is None
        if created:
            await self._create()
            link_kind = await self._link_kind()
        if link_kind == "wireguard":
            kind = DeviceKind.KERNEL
        elif link_kind == "tun" and await self.userspace_pid() is not None:
            kind = DeviceKind.USERSPACE
        else:
            raise NotWireGuard(self.name, "ensure", f"the interface exists and is {link_kind or 'gone again'}")
        if self.choice != DeviceChoice.AUTO and kind != self.choice:
            raise NotWireGuard(self.name, "ensure", f"the interface is a {kind} device, the choice is {self.choice}")
        up = ["link", "set", "dev", self.name, *(["mtu", str(self.mtu)] if self.mtu is not None else []), "up"]
        await self._run("ip link set up", [self.tools.ip, *up])
        self._kind = kind
        log.info(
            "WireGuard device ready",
            extra={"device": self.name, "kind": str(kind), "new": created, "netns": self.netns},
        )
        return kind

    async def show(self) -> DeviceState:
        out = await self._run("wg show", [self.tools.wg, "show", self.name, "dump"])
        try:
            return DeviceState.from_dump(out)
        except ValueError as exc:
            raise DeviceError(self.name, "wg show", str(exc)) from None

    async def configure(self, key: PrivateKey, listen_port: int, peers: Iterable[Peer]) -> Change:
        """Private key, listen port and the full peer list, changing only what differs (:func:`plan_set`):
        one ``wg show`` and at most one ``wg set``.  ValueError for a peer given twice."""
        return await self.update(await self.show(), key, listen_port, peers)

    async def update(self, known: DeviceState, key: PrivateKey, listen_port: int, peers: Iterable[Peer]) -> Change:
        """As :meth:`configure`, against *known* (what the caller last applied or read) instead of reading
        the device: one node's change is one ``wg set`` naming that node's peer alone, and no ``wg show``."""
        args, change = plan_set(known, key.public_key, listen_port, peers)
        if change.key_set:
            args[:0] = ["private-key", "/dev/stdin"]  # the device's settings come before the first peer
        if change:
            stdin = (key.reveal_base64() + "\n").encode("ascii") if change.key_set else b""
            await self._run("wg set", [self.tools.wg, "set", self.name, *args], stdin=stdin, secret=key)
            log.info("WireGuard device configured", extra={"device": self.name, **change.summary()})
        return change

    async def delete(self) -> bool:
        """Remove the interface (wireguard-go exits with it).  False when there was none."""
        if await self._link_kind() is None:
            return False
        await self._run("ip link del", [self.tools.ip, "link", "del", "dev", self.name])
        self._kind = None
        log.info("WireGuard device deleted", extra={"device": self.name, "netns": self.netns})
        return True

    async def userspace_pid(self) -> int | None:
        """The wireguard-go process serving this device in its namespace; None when none does.
        NotWireGuard when the socket of this name is served from another namespace."""
        return await trio.to_thread.run_sync(self._socket_owner)

    # -- internals ------------------------------------------------------------------------------

    async def _create(self) -> None:
        if self.choice != DeviceChoice.USERSPACE:
            argv = [self.tools.ip, "link", "add", "dev", self.name, "type", "wireguard"]
            proc = await trio.run_process(self._enter(argv), capture_stdout=True, capture_stderr=True, check=False)
            if proc.returncode == 0:
                return
            err = proc.stderr.decode(errors="replace")
            unsupported = "Unknown device type" in err or "not supported" in err.lower()
            if not unsupported:
                raise DeviceError(self.name, "ip link add type wireguard", err, proc.returncode)
            if self.choice == DeviceChoice.KERNEL:
                raise KernelWireGuardMissing(self.name, "ip link add type wireguard", err, proc.returncode)
            log.info("no WireGuard in this kernel: wireguard-go", extra={"device": self.name})
        await self.userspace_pid()  # NotWireGuard if another namespace serves this name
        env = {k: v for k, v in os.environ.items() if k != "LOG_LEVEL"}  # LOG_LEVEL keeps our pipes open
        env["WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD"] = "1"
        await self._run("wireguard-go", [self.tools.wireguard_go, self.name], env=env)

    async def _link_kind(self) -> str | None:
        """None: no interface of the name; else its link kind ("wireguard", "tun", "" for none)."""
        argv = [self.tools.ip, "-j", "-d", "link", "show", "dev", self.name]
        proc = await trio.run_process(self._enter(argv), capture_stdout=True, capture_stderr=True, check=False)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace")
            if "does not exist" in err:
                return None
            raise DeviceError(self.name, "ip link show", err, proc.returncode)
        links = json.loads(proc.stdout)
        return str(links[0].get("linkinfo", {}).get("info_kind", "")) if links else None

    def _socket_owner(self) -> int | None:
        # SO_PEERCRED would name the process that made the listening socket: wireguard-go's first
        # process, which exits once its daemon runs.  The namespace's own socket table
        # (/proc/thread-self/net/unix, read from a thread in it) says whether the socket is this
        # namespace's; the process holding it is found by the socket's inode.
        if not os.path.exists(self.socket_path):
            return None
        inode = call_in_netns(self.netns, self._listening_inode)
        if inode is None:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                probe.connect(self.socket_path)
            except (FileNotFoundError, ConnectionRefusedError):
                return None  # a stale socket (its process died): wireguard-go and wg replace it
            finally:
                probe.close()
            raise NotWireGuard(self.name, "ensure", f"{self.socket_path} is served from another network namespace")
        return _pid_holding(inode)

    def _listening_inode(self) -> int | None:
        with open("/proc/thread-self/net/unix") as table:
            for line in table:
                fields = line.split()
                # Num RefCount Protocol Flags Type St Inode Path; flag 0x10000: listening
                if len(fields) == 8 and fields[7] == self.socket_path and int(fields[3], 16) & 0x10000:
                    return int(fields[6])
        return None

    def _enter(self, argv: list[str]) -> list[str]:
        if self.netns is None:
            return argv
        return [self.tools.nsenter, f"--net={netns_path(self.netns)}", *argv]

    async def _run(
        self,
        step: str,
        argv: list[str],
        *,
        stdin: bytes = b"",
        secret: PrivateKey | None = None,
        env: dict[str, str] | None = None,
    ) -> str:
        proc = await trio.run_process(
            self._enter(argv), stdin=stdin, capture_stdout=True, capture_stderr=True, check=False, env=env
        )
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace")
            if secret is not None:
                err = err.replace(secret.reveal_base64(), "<private key>")
            raise DeviceError(self.name, step, err, proc.returncode)
        return proc.stdout.decode(errors="replace")
