"""BIRD follows the node's state: inputs read from :class:`NodeState`, a poke when they change."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

import attrs
import trio

from flock.bird import BirdInputs, BirdReloader
from flock.bird.passwords import BgpPasswords
from flock.bird.sessions import SessionMonitor, session_problems
from flock.model import NodeConfig
from flock.nursery import ChildSpec
from flock.state import NodeState
from flock.watchers import KubeClient


def bird_inputs(state: NodeState) -> BirdInputs | None:
    """What BIRD's configuration is rendered from; None until start-up has
    loaded the allocations (rendering without them would withdraw anycast
    addresses a predecessor announced)."""
    node = state.nodeconfig
    if node is None or not state.allocations_loaded:
        return None
    inputs = BirdInputs.collect(node, state.allocations.values(), pods=state.pods, passwords=state.bgp_passwords)
    routes = state.service_routes
    if state.leaving:
        # leaving: every Service route with GRACEFUL_SHUTDOWN (RFC 8326), then only the last-resort ones
        if state.leave_withdrawn:
            routes = tuple(attrs.evolve(r, nets=r.last_resort) for r in routes if r.last_resort)
        return attrs.evolve(inputs, services=routes, leaving=bool(routes))
    return attrs.evolve(inputs, services=routes) if routes else inputs


@attrs.define(eq=False)
class BirdFollower:
    """Supervised service: runs *reloader* and pokes it whenever the BIRD inputs
    derived from *state* change (debouncing is the reloader's)."""

    state: NodeState
    reloader: BirdReloader

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.reloader.config_path.parent.mkdir(parents=True, exist_ok=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.reloader.run)
            task_status.started()
            seen, poked = self.state.version, bird_inputs(self.state)
            while True:
                seen = await self.state.wait_changed(seen)
                inputs = bird_inputs(self.state)
                if inputs != poked:
                    poked = inputs
                    self.reloader.poke()


async def nodeconfigs(state: NodeState) -> AsyncIterator[NodeConfig]:
    """The NodeConfig in force, then each new one."""
    seen, last = state.version, None
    while True:
        if state.nodeconfig is not None and state.nodeconfig != last:
            last = state.nodeconfig
            yield last
        seen = await state.wait_changed(seen)


@attrs.define(eq=False)
class _Notes:
    """One /readyz note per peer under *prefix*, replaced as a whole."""

    state: NodeState
    prefix: str
    _topics: set[str] = attrs.field(factory=set)

    def publish(self, by_peer: dict[str, str]) -> None:
        topics = {f"{self.prefix}:{peer}": text for peer, text in by_peer.items()}
        for topic in self._topics - set(topics):
            self.state.set_note(topic, None)
        for topic, text in sorted(topics.items()):
            self.state.set_note(topic, text)
        self._topics = set(topics)


def bgp_passwords(namespace: str, state: NodeState) -> Callable[[KubeClient], Sequence[ChildSpec]]:
    """A watcher factory for the API link: the BGP password Secrets the NodeConfig
    names, published into *state* (passwords for BIRD, problems as notes)."""
    notes = _Notes(state, "bgp-password")

    def children(client: KubeClient) -> Sequence[ChildSpec]:
        passwords: BgpPasswords

        def publish() -> None:
            state.set_bgp_passwords(passwords.passwords)
            notes.publish(
                {peer: f"BGP peer {peer} is kept down: no password ({why})" for peer, why in passwords.problems.items()}
            )

        passwords = BgpPasswords(namespace, client.secret, publish)

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            await passwords.run(nodeconfigs(state), task_status=task_status)

        return [ChildSpec("bgp-passwords", run)]

    return children


def session_monitor(state: NodeState, control_socket: object, namespace: str) -> SessionMonitor:
    """BIRD's BGP sessions, polled; peers not Established become /readyz notes."""
    notes = _Notes(state, "bgp-session")
    monitor: SessionMonitor

    def publish() -> None:
        lines = session_problems(state.nodeconfig, monitor.sessions, namespace)
        notes.publish({line.split(" ", 3)[2]: line for line in lines})

    monitor = SessionMonitor(control_socket, on_refresh=publish)  # type: ignore[arg-type]
    return monitor
