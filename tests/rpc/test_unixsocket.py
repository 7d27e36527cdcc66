"""flock.rpc.PrivateSocket: 0600 socket, 0700 directory; a directory not flock's own is left as it is."""

from __future__ import annotations

import stat

import trio

from flock.rpc.server import PrivateSocket


async def test_socket_is_0600_and_its_own_directory_0700(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    sock = PrivateSocket(run / "flock.sock")
    with trio.fail_after(10):
        listener = await sock.listen()
    try:
        assert stat.S_IMODE((run / "flock.sock").stat().st_mode) == 0o600
        assert stat.S_IMODE(run.stat().st_mode) == 0o700
    finally:
        listener.close()
        sock.remove()
    assert not (run / "flock.sock").exists()


async def test_a_directory_that_is_not_flocks_own_is_never_changed(tmp_path) -> None:
    shared = tmp_path / "shared"  # e.g. --admin-socket /run/flockctl.sock: /run must stay as it is
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    sock = PrivateSocket(shared / "admin.sock", tighten_directory=False)
    with trio.fail_after(10):
        listener = await sock.listen()
    try:
        assert stat.S_IMODE(shared.stat().st_mode) == 0o755
        assert stat.S_IMODE((shared / "admin.sock").stat().st_mode) == 0o600
    finally:
        listener.close()
        sock.remove()
