"""This node's NodeConfig as one atomically replaced, validated value."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Protocol

import attrs
import trio

from flock.model import InvalidObject, NodeConfig

from ._informer import Change, ChangeType, Informer, InformerSettings, ListWatchSource, Object

log = logging.getLogger("flock.watchers")


class NodeConfigSink(Protocol):
    """Where the watcher publishes what it sees (the agent's :class:`flock.state.NodeState`)."""

    def nodeconfig_observed(self, current: NodeConfig | None, *, deleted: bool, refused: str | None) -> None: ...


def _name_key(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


@attrs.define(eq=False)
class NodeConfigWatcher:
    """Supervised service holding :attr:`current`: the last valid NodeConfig of *node*.

    An invalid spec is logged with the field and the value and ignored: the
    previous good value stays.  A deleted NodeConfig is logged and the last
    value stays too (pods keep their routes and BGP keeps announcing);
    :attr:`deleted` says so, and :meth:`wait_deleted` wakes on the change
    (the agent then stops serving ADD and fails readiness until it is back).
    Every change of these is also published to *sink* (when given).
    Error handling: see :class:`Informer`.
    """

    source: ListWatchSource
    node: str
    settings: InformerSettings = InformerSettings()
    sink: NodeConfigSink | None = None
    _current: NodeConfig | None = attrs.field(init=False, default=None)
    _changed: trio.Event = attrs.field(init=False, factory=trio.Event)
    _invalid: InvalidObject | None = attrs.field(init=False, default=None)
    _deleted: bool = attrs.field(init=False, default=False)
    _presence: trio.Event = attrs.field(init=False, factory=trio.Event)
    _informer: Informer = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._informer = Informer(
            self.source,
            _name_key,
            self._on_change,  # One object: a list is as good as a WatchList (which custom resources' client calls lack).
            attrs.evolve(self.settings, watch_list=False),
            name=f"nodeconfig {self.node}",
        )

    @property
    def informer(self) -> Informer:
        return self._informer

    @property
    def current(self) -> NodeConfig | None:
        """The last valid NodeConfig, or None before one has been seen."""
        return self._current

    @property
    def invalid(self) -> InvalidObject | None:
        """Why the newest NodeConfig on the server was refused (None when it was accepted)."""
        return self._invalid

    @property
    def deleted(self) -> bool:
        """True while the NodeConfig is gone from the server (:attr:`current` is the last one seen)."""
        return self._deleted

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; started() once the first list is done (there
        may be no NodeConfig yet: use :meth:`wait_changed` to wait for one)."""
        await self._informer.run(task_status=task_status)

    async def wait_changed(self, since: NodeConfig | None = None) -> NodeConfig:
        """The current value as soon as it is not None and differs from *since*.

        Level-triggered: a caller that passes what it last saw misses nothing
        that is still current.  Waits forever: the caller owns the deadline.
        """
        while self._current is None or self._current == since:
            await self._changed.wait()
        return self._current

    async def wait_deleted(self, deleted: bool) -> None:
        """Until :attr:`deleted` is *deleted* (at once if it is)."""
        while self._deleted != deleted:
            await self._presence.wait()

    def _set_deleted(self, deleted: bool) -> None:
        self._deleted = deleted
        self._presence.set()
        self._presence = trio.Event()

    async def values(self) -> AsyncIterator[NodeConfig]:
        """The current value, then each new one (intermediate values may be skipped)."""
        seen: NodeConfig | None = None
        while True:
            seen = await self.wait_changed(seen)
            yield seen

    def _on_change(self, change: Change) -> None:
        if change.key != self.node:
            return
        self._observe(change)
        if self.sink is not None:
            refused = None if self._invalid is None else str(self._invalid)
            self.sink.nodeconfig_observed(self._current, deleted=self._deleted, refused=refused)

    def _observe(self, change: Change) -> None:
        if change.type is ChangeType.DELETED:
            self._set_deleted(True)
            log.warning(
                "NodeConfig %s was deleted; existing pods keep working, ADD waits until it is back",
                self.node,
                extra={"node": self.node},
            )
            return
        if self._deleted:
            self._set_deleted(False)
            log.info("NodeConfig %s exists again", self.node, extra={"node": self.node})
        try:
            value = NodeConfig.from_object(change.object)
        except InvalidObject as exc:
            self._invalid = exc
            log.error(
                "NodeConfig %s refused: %s; keeping the previous one",
                self.node,
                exc,
                extra={"node": self.node, "field": exc.field, "value": repr(exc.value)},
            )
            return
        self._invalid = None
        if value != self._current:
            self._current = value
            self._changed.set()
            self._changed = trio.Event()
