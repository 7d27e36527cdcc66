"""One Secret, by name, as decoded bytes per key (for BGP passwords).

Nothing here logs or formats a Secret's values: only its name, its keys and
what is wrong with them.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Mapping

import attrs
import trio

from ._informer import Change, ChangeType, Informer, InformerSettings, ListWatchSource, Object

log = logging.getLogger("flock.watchers")


def _name_key(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def decode_secret(obj: Object) -> dict[str, bytes]:
    """A Secret's ``data`` decoded; keys whose value is not base64 are left out."""
    data = obj.get("data") or {}
    out = {}
    if isinstance(data, Mapping):
        for key, value in data.items():
            try:
                out[str(key)] = base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                continue
    return out


@attrs.define(eq=False)
class SecretWatcher:
    """Supervised service holding :attr:`data`: the Secret's keys and decoded values,
    or None while it does not exist.  *on_change* is called after every change.

    Error handling: see :class:`Informer` (a 403 — RBAC not granting this
    Secret — propagates to the supervisor, which restarts with backoff).
    """

    source: ListWatchSource
    namespace: str
    name: str
    on_change: Callable[[], None] = lambda: None
    settings: InformerSettings = attrs.field(factory=InformerSettings)
    _data: dict[str, bytes] | None = attrs.field(init=False, default=None, repr=False)
    _informer: Informer = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._informer = Informer(
            self.source,
            _name_key,
            self._on_change,  # One object: a list is as good as a WatchList (which custom resources' client calls lack).
            attrs.evolve(self.settings, watch_list=False),
            name=f"secret {self.namespace}/{self.name}",
        )

    @property
    def ready(self) -> bool:
        return self._informer.ready

    @property
    def data(self) -> Mapping[str, bytes] | None:
        return self._data

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._informer.run(task_status=task_status)

    def _on_change(self, change: Change) -> None:
        if change.key != self.name:
            return
        if change.type is ChangeType.DELETED:
            self._data = None
            log.warning("secret %s/%s was deleted", self.namespace, self.name, extra={"secret": self.name})
        else:
            self._data = decode_secret(change.object)
            log.info(
                "secret %s/%s read",
                self.namespace,
                self.name,
                extra={"secret": self.name, "keys": sorted(self._data)},
            )
        self.on_change()
