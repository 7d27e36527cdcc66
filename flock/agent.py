"""flock-agent: composes the supervision tree (DESIGN: "Supervision tree"); its CLI.

:class:`Agent` is the root supervisor: the signal watcher, then the services
(the RPC server first).  :func:`flock.node.compose` adds the node's services
(:mod:`flock.node`): the allocation store before the RPC server, then the
health server, then the node subtree (watchers → pod start-up → BIRD
reloader), so DEL and CHECK are served as soon as the store is open and ADD
once start-up has finished.

SIGTERM/SIGINT: drain (the RPC server stops accepting, requests in flight
get a bounded time, the socket file goes), then cancel the tree → exit 0.
A second signal cancels at once.  Escalation out of the root supervisor →
exit 1, so the kubelet restarts the container.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from flock import logs
from flock.nursery import ChildSpec, RestartIntensity, Supervisor, SupervisorEscalation
from flock.rpc.server import RpcServer, SocketInUse

log = logging.getLogger("flock.agent")

DEFAULT_SOCKET = Path("/run/flock/flock.sock")
DEFAULT_STATE_DIR = Path("/var/lib/flock")
# Every drain hook together must finish within this (the kubelet's grace
# period is 30 s by default; the RPC server's own drain deadline is shorter).
SHUTDOWN_DEADLINE_S = 5.0
ROOT_INTENSITY = RestartIntensity(max_restarts=5, period=60.0)

EXIT_OK = 0
EXIT_ESCALATED = 1


class StateDirError(Exception):
    """The state directory cannot be created or written; the message names it and what to do."""


DEFAULT_HEALTH_ADDRESS = ("127.0.0.1", 9464)
DEFAULT_BIRD_CONFIG = Path("/etc/flock/bird/bird.conf")
DEFAULT_BIRD_SOCKET = Path("/run/flock/bird.ctl")


@attrs.frozen
class AgentSettings:
    node: str
    socket: Path = DEFAULT_SOCKET
    state_dir: Path = DEFAULT_STATE_DIR
    kubeconfig: Path | None = None  # None: in-cluster config (used by the watchers)
    health_address: tuple[str, int] = DEFAULT_HEALTH_ADDRESS
    bird: bool = True  # False: no BIRD on this node (nothing is rendered or reloaded)
    bird_config: Path = DEFAULT_BIRD_CONFIG
    bird_socket: Path = DEFAULT_BIRD_SOCKET
    bgp_lab_timers: bool = False  # short BGP timers (labs, tests)
    host_netns: str | None = None  # the node's network namespace (None: the agent's own)
    uplink: str | None = None  # interface for the pod gateway's route if the node has none
    namespace: str = "kube-system"  # the agent's own namespace: where BGP password Secrets are read


@attrs.define(eq=False)
class Agent:
    """The root of the supervision tree.  Add children before :meth:`run`."""

    settings: AgentSettings
    intensity: RestartIntensity = ROOT_INTENSITY
    server: RpcServer = attrs.field(init=False)
    _services: list[ChildSpec] = attrs.field(init=False, factory=list)
    _drains: list[Callable[[], Awaitable[None]]] = attrs.field(init=False, factory=list)
    _root: trio.CancelScope = attrs.field(init=False, factory=trio.CancelScope)

    def __attrs_post_init__(self) -> None:
        self.server = RpcServer(self.settings.socket)
        # Another agent on the socket does not go away by restarting: exit at once.
        self.add_child(ChildSpec("rpc", self.server.run, fatal=(SocketInUse,)), drain=self.server.drain)

    def add_child(
        self, spec: ChildSpec, *, before: str | None = None, drain: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Supervise *spec* (after the existing services, or just before the one named
        *before*); *drain*, if given, is awaited at shutdown before the tree is cancelled."""
        names = [s.name for s in self._services]
        if spec.name in names or spec.name == "signals":
            raise ValueError(f"child {spec.name!r} already exists")
        self._services.insert(names.index(before) if before is not None else len(names), spec)
        if drain is not None:
            self._drains.append(drain)

    @property
    def children(self) -> Sequence[ChildSpec]:
        return (ChildSpec("signals", self._watch_signals), *self._services)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until a signal (returns) or until the tree escalates (SupervisorEscalation)."""
        _check_state_dir(self.settings.state_dir)
        log.info("starting", extra={"node": self.settings.node, "socket": str(self.settings.socket)})
        with self._root:
            await Supervisor("flock-agent", self.children, intensity=self.intensity).run(task_status=task_status)
        log.info("stopped")

    async def shutdown(self) -> None:
        """Drain every service that asked for it (bounded), then cancel the tree."""
        with trio.move_on_after(SHUTDOWN_DEADLINE_S) as scope:
            for drain in self._drains:
                await drain()
        if scope.cancelled_caught:
            log.warning("drain did not finish in time", extra={"deadline_s": SHUTDOWN_DEADLINE_S})
        self._root.cancel()

    async def _watch_signals(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async with trio.open_nursery() as nursery:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if nursery.child_tasks:
                        log.warning("second signal: stopping now", extra={"signal": name})
                        self._root.cancel()
                    else:
                        log.info("signal: shutting down", extra={"signal": name})
                        nursery.start_soon(self.shutdown)


def _check_state_dir(path: Path) -> None:
    """Create *path* if needed; raise :class:`StateDirError` unless it is a writable directory."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        what = (
            "exists and is not a directory"
            if path.exists() and not path.is_dir()
            else f"cannot create it ({exc.strerror})"
        )
        raise StateDirError(
            f"state directory {path}: {what}; mount a writable directory there or pass --state-dir"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StateDirError(
            f"state directory {path}: not writable (read-only mount?); "
            "mount a writable directory there or pass --state-dir"
        )


def _service_account_namespace() -> str | None:
    try:
        return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip() or None
    except OSError:
        return None


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464")
    return host, int(port)


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str]) -> tuple[AgentSettings, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="flock-agent", description="flock's node agent")
    parser.add_argument("--node", default=environ.get("NODE_NAME"), help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--socket", type=Path, default=DEFAULT_SOCKET, help="CNI RPC socket (default: %(default)s)")
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="allocation store directory (default: %(default)s)"
    )
    parser.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig file (default: in-cluster)")
    parser.add_argument(
        "--health-address",
        type=_host_port,
        default=DEFAULT_HEALTH_ADDRESS,
        metavar="HOST:PORT",
        help="/healthz, /readyz and /metrics (default: 127.0.0.1:9464)",
    )
    parser.add_argument(
        "--bird-config", type=Path, default=DEFAULT_BIRD_CONFIG, help="rendered BIRD config (default: %(default)s)"
    )
    parser.add_argument(
        "--bird-socket", type=Path, default=DEFAULT_BIRD_SOCKET, help="BIRD control socket (default: %(default)s)"
    )
    parser.add_argument("--no-bird", action="store_true", help="no BIRD on this node: render and reload nothing")
    parser.add_argument(
        "--bgp-lab-timers", action="store_true", help="short BGP timers (labs and tests, not production)"
    )
    parser.add_argument(
        "--host-netns",
        default=None,
        metavar="PATH",
        help="network namespace holding the node's interfaces and routes (default: the agent's own)",
    )
    parser.add_argument(
        "--uplink",
        default=None,
        metavar="IFACE",
        help="interface for a route to the pod gateway 169.254.1.1 when the node has none",
    )
    parser.add_argument(
        "--namespace",
        default=environ.get("POD_NAMESPACE") or _service_account_namespace() or "kube-system",
        help="the agent's namespace, where BGP password Secrets are read "
        "(default: $POD_NAMESPACE, else the service account's, else kube-system)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="json", choices=["json", "text"])
    args = parser.parse_args(argv)
    if not args.node:
        parser.error("--node is required (or set NODE_NAME)")
    if not args.socket.is_absolute():
        parser.error(f"--socket {args.socket}: expected an absolute path")
    if args.kubeconfig is not None and not os.access(args.kubeconfig, os.R_OK):
        parser.error(f"--kubeconfig {args.kubeconfig}: not a readable file")
    if args.host_netns is not None and not os.path.exists(args.host_netns):
        parser.error(f"--host-netns {args.host_netns}: no such namespace file")
    for flag, path in (("--bird-config", args.bird_config), ("--bird-socket", args.bird_socket)):
        if not path.is_absolute():
            parser.error(f"{flag} {path}: expected an absolute path")
    settings = AgentSettings(
        node=args.node,
        socket=args.socket,
        state_dir=args.state_dir,
        kubeconfig=args.kubeconfig,
        health_address=args.health_address,
        bird=not args.no_bird,
        bird_config=args.bird_config,
        bird_socket=args.bird_socket,
        bgp_lab_timers=args.bgp_lab_timers,
        host_netns=args.host_netns,
        uplink=args.uplink,
        namespace=args.namespace,
    )
    return settings, args


def serve(agent: Agent, clock: trio.abc.Clock | None = None) -> int:
    """Run *agent* to completion; the process exit status."""
    try:
        trio.run(agent.run, clock=clock)
    except StateDirError as exc:
        log.critical("cannot start", extra={"error": str(exc)})
        _tell_operator(str(exc))
        return EXIT_ESCALATED
    except SupervisorEscalation as exc:
        log.critical("supervision tree gave up", exc_info=True)
        if exc.fatal:
            _tell_operator(f"{exc.__cause__}")
        return EXIT_ESCALATED
    return EXIT_OK


def _tell_operator(message: str) -> None:
    # One plain last line on stderr: what `kubectl logs --previous` shows first
    # when the container exits at once instead of restarting for minutes.
    print(f"flock-agent: fatal: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    from flock.node import compose  # the node's services import the whole stack
    from flock.pods import CrashPoint

    settings, args = parse_args(argv, os.environ)
    try:
        crash = CrashPoint.from_environ(os.environ)
    except ValueError as exc:
        sys.exit(f"flock-agent: {exc}")
    logs.configure(level=args.log_level, fmt=args.log_format)
    sys.exit(serve(compose(settings, crash=crash)))
