"""The agent's private unix sockets (the CNI socket and flockctl's admin socket).

One way to bind them: in a 0700 directory, mode 0600, atomically (bound beside
the final name and renamed over it, so a client never sees a missing socket or
one with the umask's permissions), never over a live agent's socket or over
something that is not a socket, and removed on exit only while the path is
still ours (a newer agent may own it by then).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import attrs
import trio

log = logging.getLogger("flock.rpc")

PROBE_DEADLINE_S = 1.0


class SocketInUse(RuntimeError):
    """Another flock-agent answers on the socket path, or the path is not a socket."""


@attrs.define(eq=False)
class PrivateSocket:
    path: Path
    backlog: int = 128
    # The CNI socket's directory is flock's own (/run/flock): an existing one is tightened to 0700. The admin
    # socket may be put anywhere by --admin-socket: its directory is created 0700 but never changed.
    tighten_directory: bool = True
    _inode: tuple[int, int] | None = attrs.field(init=False, default=None)

    async def listen(self) -> trio.socket.SocketType:
        """A listening socket at :attr:`path`; :class:`SocketInUse` if another agent serves there."""
        self._prepare_directory()
        await self._refuse_live_agent()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        try:
            await sock.bind(str(tmp))
            os.chmod(tmp, 0o600)
            sock.listen(self.backlog)
            os.replace(tmp, self.path)
        except BaseException:
            sock.close()
            tmp.unlink(missing_ok=True)
            raise
        st = self.path.stat()
        self._inode = (st.st_dev, st.st_ino)
        return sock

    def remove(self) -> None:
        """Unlink the socket file if it is still ours."""
        if self._inode is None:
            return
        try:
            st = self.path.lstat()
            if (st.st_dev, st.st_ino) == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        self._inode = None

    def _prepare_directory(self) -> None:
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.tighten_directory:
            return
        mode = directory.stat().st_mode
        # Tighten flock's own directory; leave shared sticky ones (/tmp) alone.
        if stat.S_IMODE(mode) & 0o077 and not mode & stat.S_ISVTX:
            log.info("restricting socket directory to 0700", extra={"directory": str(directory)})
            directory.chmod(0o700)

    async def _refuse_live_agent(self) -> None:
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketInUse(f"{self.path} exists and is not a socket; refusing to replace it")
        probe = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        with probe:
            try:
                with trio.fail_after(PROBE_DEADLINE_S):
                    await probe.connect(str(self.path))
            except (ConnectionRefusedError, FileNotFoundError):
                log.warning("replacing stale socket", extra={"socket": str(self.path)})
                return
            except (OSError, trio.TooSlowError) as exc:
                raise SocketInUse(f"{self.path} is busy ({exc!r}); another flock-agent may be running") from exc
        raise SocketInUse(f"another flock-agent answers on {self.path}")
