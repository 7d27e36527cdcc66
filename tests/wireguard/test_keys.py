"""The node's key on disk: created once (0600 in 0700), re-read, never replaced, rotated beside; never shown."""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
import os
import pickle
import shutil
import subprocess

import attrs
import pytest

from flock.logs import JsonFormatter, TextFormatter
from flock.wireguard import (
    InvalidKey,
    KeyFileCorrupt,
    KeyFileUnsafe,
    KeyStore,
    NodeKey,
    PrivateKey,
    PublicKey,
    RotationPending,
)
from flock.wireguard._keys import CURRENT, NEXT, PREVIOUS


def _wg() -> str:
    found = shutil.which("wg")
    if found is None:
        pytest.fail("wg not found: install Debian's wireguard-tools (scripts/bootstrap does)")
    return found


def _mode(path: os.PathLike[str] | str) -> int:
    return os.stat(path).st_mode & 0o7777


def test_public_key_matches_wg_pubkey() -> None:
    wg = _wg()
    for _ in range(5):
        key = PrivateKey.generate()
        out = subprocess.run([wg, "pubkey"], input=key.reveal_base64() + "\n", capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == key.public_key.base64
    # and a key made by wg genkey reads back with the same public key wg derives
    genkey = subprocess.run([wg, "genkey"], capture_output=True, text=True, check=True).stdout.strip()
    pub = subprocess.run([wg, "pubkey"], input=genkey, capture_output=True, text=True, check=True).stdout.strip()
    assert PrivateKey.from_base64(genkey).public_key == PublicKey.from_base64(pub)


def test_generated_keys_are_clamped_and_distinct() -> None:
    keys = {PrivateKey.generate().reveal_base64() for _ in range(20)}
    assert len(keys) == 20
    for text in keys:
        raw = base64.b64decode(text)
        assert raw[0] & 7 == 0 and raw[31] & 0xC0 == 0x40


def test_created_once_then_reread(tmp_path) -> None:
    store = KeyStore(tmp_path / "var" / "wireguard")
    old_umask = os.umask(0)  # the modes must not depend on the umask
    try:
        keys = store.load_or_create()
    finally:
        os.umask(old_umask)
    path = store.directory / CURRENT
    assert _mode(store.directory) == 0o700 and _mode(path) == 0o600
    text = path.read_text()
    assert text == keys.current.reveal_base64() + "\n" and keys.previous is None
    inode = os.stat(path).st_ino
    # a restart: the same key, the same file (not rewritten)
    again = KeyStore(store.directory).load_or_create()
    assert again == keys and os.stat(path).st_ino == inode and path.read_text() == text
    assert sorted(os.listdir(store.directory)) == [CURRENT]


def test_load_without_key_is_file_not_found(tmp_path) -> None:
    os.mkdir(tmp_path / "k", 0o700)
    with pytest.raises(FileNotFoundError):
        KeyStore(tmp_path / "k").load()


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage\n", b"A" * 44 + b"\n", b"%" * 43 + b"=\n", b"\xff" * 45, b"x" * 200],
    ids=["empty", "short", "no-padding", "not-base64", "binary", "long"],
)
def test_corrupt_key_is_an_error_and_left_alone(tmp_path, content: bytes) -> None:
    store = KeyStore(tmp_path)
    os.chmod(tmp_path, 0o700)
    path = tmp_path / CURRENT
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(KeyFileCorrupt) as info:
        store.load_or_create()
    assert str(path) in str(info.value) and "no key" in str(info.value)
    shown = content.decode(errors="ignore").strip()[:8]
    if shown:
        assert shown not in str(info.value)
    assert path.read_bytes() == content and os.listdir(tmp_path) == [CURRENT]


def test_wrong_permissions_are_errors(tmp_path) -> None:
    store = KeyStore(tmp_path / "k")
    store.load_or_create()
    key_file = store.directory / CURRENT
    before = key_file.read_bytes()
    os.chmod(key_file, 0o644)
    with pytest.raises(KeyFileUnsafe) as info:
        store.load()
    assert info.value.got == "0644" and "0600" in str(info.value)
    os.chmod(key_file, 0o600)
    os.chmod(store.directory, 0o755)
    with pytest.raises(KeyFileUnsafe, match="0700"):
        store.load_or_create()
    os.chmod(store.directory, 0o700)
    os.chown(key_file, 65534, -1)
    with pytest.raises(KeyFileUnsafe, match="owner"):
        store.load()
    os.chown(key_file, os.geteuid(), -1)
    # a symlink in place of the key file is refused, not followed
    os.rename(key_file, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", key_file)
    with pytest.raises(KeyFileUnsafe, match="symlink"):
        store.load_or_create()
    assert (tmp_path / "elsewhere").read_bytes() == before


def test_rotation_beside_then_forget(tmp_path) -> None:
    store = KeyStore(tmp_path / "k")
    first = store.load_or_create()
    rotated = store.rotate()
    assert rotated.previous == first.current and rotated.current != first.current
    assert store.load() == rotated  # survives a restart
    assert _mode(store.directory / PREVIOUS) == 0o600 and _mode(store.directory / CURRENT) == 0o600
    with pytest.raises(RotationPending):
        store.rotate()
    assert store.load() == rotated  # the refused rotation changed nothing
    assert store.forget_previous() == NodeKey(rotated.current)
    assert sorted(os.listdir(store.directory)) == [CURRENT]
    assert store.rotate().previous == rotated.current


def test_interrupted_rotation_is_discarded(tmp_path) -> None:
    store = KeyStore(tmp_path / "k")
    keys = store.load_or_create()
    # a rotation that stopped after writing the new key beside (before the switch)
    fd = os.open(store.directory / NEXT, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, (PrivateKey.generate().reveal_base64() + "\n").encode())
    os.close(fd)
    (store.directory / ".private.key.0000.tmp").write_bytes(b"half")
    assert store.load() == keys
    assert sorted(os.listdir(store.directory)) == [CURRENT]


def test_invalid_key_text_is_not_echoed() -> None:
    secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I="  # 44 chars, 32 bytes
    bad = secret[:-2] + "!="
    with pytest.raises(InvalidKey) as info:
        PrivateKey.from_base64(bad)
    assert bad not in str(info.value) and secret[:10] not in str(info.value)
    with pytest.raises(InvalidKey):
        PublicKey.from_base64(secret[:40])


@attrs.frozen
class _Export:
    """An attrs value holding keys, as a status or a report flock exports would."""

    node: str
    keys: NodeKey


def test_private_key_never_shown(caplog: pytest.LogCaptureFixture, tmp_path) -> None:
    caplog.set_level(logging.DEBUG, logger="flock.wireguard")
    store = KeyStore(tmp_path / "k")
    store.load_or_create()
    keys = store.rotate()  # flock's own log lines about the keys, captured below
    store.forget_previous()
    key = keys.current
    assert keys.previous is not None
    secrets = [key.reveal_base64(), keys.previous.reveal_base64()]
    secrets += [base64.b64decode(s).hex() for s in secrets]
    shown = [repr(key), str(key), f"{key}", f"{key!r:>80}", repr(keys), str(_Export("a", keys))]
    shown.append(json.dumps(attrs.asdict(_Export("a", keys)), default=str))
    shown.append(json.dumps({"key": key, "keys": keys}, default=str))
    # flock's own log formatters, with the key in the message and in extra fields
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    for formatter in (JsonFormatter(), TextFormatter()):
        handler.setFormatter(formatter)
        logger = logging.getLogger("flock.wireguard.test")
        logger.addHandler(handler)
        try:
            logger.warning("key %s %r", key, keys, extra={"key": key, "keys": keys})
        finally:
            logger.removeHandler(handler)
    shown.append(stream.getvalue())
    shown.append(caplog.text)
    assert "WireGuard key rotated" in caplog.text
    for text in shown:
        assert key.public_key.base64 in text or "<secret>" in text, text
        for secret in secrets:
            assert secret not in text
    with pytest.raises(TypeError):
        pickle.dumps(key)
    assert copy.deepcopy(keys).current is key and copy.copy(key) is key
