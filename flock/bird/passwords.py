"""BGP passwords (TCP MD5) from Kubernetes Secrets in the agent's own namespace.

The NodeConfig names, per peer, a Secret and a key (``password.secretKeyRef``);
:class:`BgpPasswords` watches exactly those Secrets (one list+watch each, with
a ``metadata.name`` field selector, which RBAC ``resourceNames`` can grant) and
offers the passwords by peer name to the BIRD reloader, which renders them into
a separate 0600 include file.  Values never reach a log line, a metric, an
error or ``/readyz``: problems name the Secret, the key and what is wrong.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Callable, Mapping

import attrs
import trio

from flock.bird.render import password_usable
from flock.model import NodeConfig
from flock.watchers import KubeError, ListWatchSource, SecretWatcher

log = logging.getLogger("flock.bird")

#: Retry a Secret the agent may not read (RBAC) or cannot reach, at most this often.
RETRY_INITIAL_S = 1.0
RETRY_MAX_S = 30.0

SecretData = Mapping[str, bytes] | None  # None: the Secret does not exist


def resolve_passwords(
    node: NodeConfig | None, namespace: str, secrets: Mapping[str, SecretData]
) -> tuple[dict[str, str], dict[str, str]]:
    """(password by peer, problem by peer) for *node*'s peers that reference one.

    *secrets* maps Secret names to their decoded data (None: not found; a name
    missing from the mapping: not read yet).  Pure: no I/O, no logging.
    """
    passwords: dict[str, str] = {}
    problems: dict[str, str] = {}
    for peer in node.bgp.peers if node is not None and node.bgp is not None else ():
        ref = peer.password
        if ref is None:
            continue
        where = f"Secret {namespace}/{ref.name}"
        if ref.name not in secrets:
            problems[peer.name] = f"{where} not read yet"
            continue
        data = secrets[ref.name]
        if data is None:
            problems[peer.name] = f"{where} not found"
        elif ref.key not in data:
            problems[peer.name] = f"{where} has no key {ref.key!r} (keys: {', '.join(sorted(data)) or 'none'})"
        else:
            try:
                value = data[ref.key].decode("ascii")
            except UnicodeDecodeError:
                value = None
            if value is None or not password_usable(value):
                problems[peer.name] = (
                    f"{where} key {ref.key!r}: not a usable BGP password "
                    "(expected 1..80 printable ASCII characters without '\"' or '\\')"
                )
            else:
                passwords[peer.name] = value
    return passwords, problems


@attrs.define(eq=False)
class BgpPasswords:
    """Supervised service: follows the NodeConfig, watches the Secrets it names.

    ``source_for(namespace, name)`` makes the list+watch source of one Secret.
    ``on_change`` (the reloader's poke) is called whenever a password may have
    changed.  Error handling: a Secret that cannot be read (403 from RBAC, the
    API down) is retried with backoff and reported in :attr:`problems`; it
    never stops the other Secrets or the agent.
    """

    namespace: str
    source_for: Callable[[str, str], ListWatchSource]
    on_change: Callable[[], None] = lambda: None
    _node: NodeConfig | None = attrs.field(init=False, default=None)
    _watchers: dict[str, SecretWatcher] = attrs.field(init=False, factory=dict)
    _scopes: dict[str, trio.CancelScope] = attrs.field(init=False, factory=dict)
    _errors: dict[str, str] = attrs.field(init=False, factory=dict)
    # The last data read per Secret: a watcher restarting (API trouble) does
    # not take a password away, which would take the session down.
    _last: dict[str, SecretData] = attrs.field(init=False, factory=dict, repr=False)

    @property
    def passwords(self) -> dict[str, str]:
        return resolve_passwords(self._node, self.namespace, self._secrets())[0]

    @property
    def problems(self) -> dict[str, str]:
        """What keeps a peer's password from BIRD, by peer name (no values)."""
        problems = resolve_passwords(self._node, self.namespace, self._secrets())[1]
        for peer in self._node.bgp.peers if self._node is not None and self._node.bgp is not None else ():
            if peer.password is not None and (error := self._errors.get(peer.password.name)):
                problems[peer.name] = error
        return problems

    def _secrets(self) -> dict[str, SecretData]:
        return dict(self._last)

    async def run(
        self, nodeconfigs: AsyncIterable[NodeConfig], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow *nodeconfigs* (e.g. ``NodeConfigWatcher.values()``) until cancelled."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for node in nodeconfigs:
                self._node = node
                wanted = {p.password.name for p in (node.bgp.peers if node.bgp else ()) if p.password is not None}
                for name in set(self._scopes) - wanted:
                    self._scopes.pop(name).cancel()
                    self._watchers.pop(name, None)
                    self._errors.pop(name, None)
                    self._last.pop(name, None)
                for name in sorted(wanted - set(self._scopes)):
                    self._scopes[name] = trio.CancelScope()
                    nursery.start_soon(self._watch, name, self._scopes[name])
                self.on_change()

    async def _watch(self, name: str, scope: trio.CancelScope) -> None:
        delay = RETRY_INITIAL_S
        with scope:
            while True:
                watcher = SecretWatcher(self.source_for(self.namespace, name), self.namespace, name, self._changed)
                self._watchers[name] = watcher
                try:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(watcher.run)
                        self._changed()  # listed: present or absent, it is known now
                except* KubeError as group:
                    exc = group.exceptions[0]
                    self._errors[name] = (
                        f"cannot read Secret {self.namespace}/{name}: {exc} "
                        "(is it listed in the flock-agent-bgp-secrets Role's resourceNames?)"
                    )
                    log.error(
                        "cannot read a BGP password Secret; retrying",
                        extra={"secret": f"{self.namespace}/{name}", "error": str(exc), "retry_in": delay},
                    )
                    self.on_change()
                await trio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)

    def _changed(self) -> None:
        for name, watcher in self._watchers.items():
            if watcher.ready:
                self._errors.pop(name, None)
                self._last[name] = None if watcher.data is None else dict(watcher.data)
        self.on_change()


__all__ = ["BgpPasswords", "resolve_passwords"]
