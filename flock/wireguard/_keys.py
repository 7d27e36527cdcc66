"""A node's WireGuard key pair: the private key on disk and never shown, the public key for others.

The key directory (0700, owned by the agent's user) holds::

    private.key            the key in use: 0600, base64 and a newline (``wg genkey``'s format)
    private.key.previous   the key before the last rotation, kept until :meth:`KeyStore.forget_previous`
    private.key.next       only during a rotation; a leftover (an interrupted rotation) was never in use
                           and is removed at the next load

A key file is written whole under a temporary name (``O_EXCL``, 0600, fsynced) and then linked or
renamed into place, so ``private.key`` is always a complete key: the old one or the new one.  A key
file that is unreadable as a key, or open to group/other, or not owned by this user, or a symlink, is
an error that names the path and what was wrong; flock never replaces it (that would change the
node's identity behind its peers' back) and never echoes its content.

:class:`PrivateKey` never shows its value: not in ``repr``/``str``/``format``, not pickled or
copied out; the one way out is :meth:`PrivateKey.reveal_base64`, for ``wg``'s stdin and the key
file.  Key generation is the ``cryptography`` package's X25519, clamped as ``wg genkey`` clamps.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import pathlib
import secrets
import stat
from typing import NoReturn

import attrs
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

log = logging.getLogger("flock.wireguard")

KEY_BYTES = 32
KEY_BASE64_CHARS = 44  # base64 of 32 bytes, one '=' of padding
CURRENT = "private.key"
PREVIOUS = "private.key.previous"
NEXT = "private.key.next"
_TMP_PREFIX = ".private.key."
_MAX_FILE = 128  # a key file is 45 bytes; read no more than this


class InvalidKey(ValueError):
    """A text is no WireGuard key (44 base64 characters for 32 bytes).  Never carries the text."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason} (expected {KEY_BASE64_CHARS} base64 characters encoding {KEY_BYTES} bytes)")
        self.what = what
        self.reason = reason


class KeyFileCorrupt(ValueError):
    """The key file exists but holds no key.  Left as it is: repair or remove it by hand."""

    def __init__(self, path: pathlib.Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}; expected one base64 WireGuard key and a newline (left untouched)")
        self.path = path
        self.reason = reason


class KeyFileUnsafe(PermissionError):
    """The key file or directory is open to others, owned by someone else, or not what it should be."""

    def __init__(self, path: pathlib.Path, expected: str, got: str) -> None:
        super().__init__(f"{path}: expected {expected}, got {got} (left untouched)")
        self.path = path
        self.expected = expected
        self.got = got


class RotationPending(FileExistsError):
    """A rotation was asked for while the previous key is still kept (not yet forgotten)."""

    def __init__(self, path: pathlib.Path) -> None:
        super().__init__(f"{path} still holds the key before the last rotation: forget it before rotating again")
        self.path = path


def _decode_key(text: str, what: str) -> bytes:
    if len(text) != KEY_BASE64_CHARS:
        raise InvalidKey(what, f"{len(text)} characters")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise InvalidKey(what, "not base64") from None
    if len(raw) != KEY_BYTES:
        raise InvalidKey(what, f"{len(raw)} bytes")
    return raw


def _check_raw(instance: object, attribute: attrs.Attribute, value: bytes) -> None:
    if not isinstance(value, bytes) or len(value) != KEY_BYTES:
        raise ValueError(f"{attribute.name}: expected {KEY_BYTES} bytes")


@attrs.frozen(order=True)
class PublicKey:
    """A WireGuard public key; ``str()`` is its base64 form, as ``wg`` prints it and other nodes read it."""

    raw: bytes = attrs.field(validator=_check_raw, repr=False)

    @classmethod
    def from_base64(cls, text: str, what: str = "public key") -> PublicKey:
        return cls(_decode_key(text, what))

    @property
    def base64(self) -> str:
        return base64.b64encode(self.raw).decode("ascii")

    def __str__(self) -> str:
        return self.base64

    def __repr__(self) -> str:
        return f"PublicKey({self.base64!r})"


class PrivateKey:
    """A WireGuard private key that does not show itself (see the module's docstring)."""

    __slots__ = ("__raw", "_public")

    def __init__(self, raw: bytes) -> None:
        if not isinstance(raw, bytes) or len(raw) != KEY_BYTES:
            raise InvalidKey("private key", "wrong length")
        self.__raw = raw
        public = X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
        self._public = PublicKey(public)

    @classmethod
    def generate(cls) -> PrivateKey:
        raw = bytearray(X25519PrivateKey.generate().private_bytes_raw())
        # Clamped as wg genkey does (X25519 clamps again when it multiplies; the stored key matches wg's).
        raw[0] &= 248
        raw[31] = (raw[31] & 127) | 64
        return cls(bytes(raw))

    @classmethod
    def from_base64(cls, text: str, what: str = "private key") -> PrivateKey:
        return cls(_decode_key(text, what))

    @property
    def public_key(self) -> PublicKey:
        return self._public

    def reveal_base64(self) -> str:
        """The key itself, base64: only for ``wg``'s stdin and the key file, never a log, argv or export."""
        return base64.b64encode(self.__raw).decode("ascii")

    def __repr__(self) -> str:
        return f"PrivateKey(<secret>, public={self._public.base64})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrivateKey):
            return NotImplemented
        return hmac.compare_digest(self.__raw, other.__raw)

    def __hash__(self) -> int:
        return hash(self._public)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a PrivateKey is not pickled or copied out of the process")

    def __copy__(self) -> PrivateKey:
        return self

    def __deepcopy__(self, memo: object) -> PrivateKey:
        return self


@attrs.frozen
class NodeKey:
    """What the key directory holds: the key in use and, after a rotation until forgotten, the one before."""

    current: PrivateKey
    previous: PrivateKey | None = None

    @property
    def public_key(self) -> PublicKey:
        return self.current.public_key


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_owned_private(path: pathlib.Path, st: os.stat_result, kind: str) -> None:
    if st.st_uid != os.geteuid():
        raise KeyFileUnsafe(path, f"owner uid {os.geteuid()}", f"uid {st.st_uid}")
    if st.st_mode & 0o077:
        want = "0700" if kind == "directory" else "0600"
        raise KeyFileUnsafe(path, f"mode {want} (nothing for group or others)", f"{stat.S_IMODE(st.st_mode):04o}")


@attrs.frozen
class KeyStore:
    """The key directory of one node.  Blocking file I/O: call from a thread (``trio.to_thread``)."""

    directory: pathlib.Path = attrs.field(converter=pathlib.Path)

    def load(self) -> NodeKey:
        """The keys on disk.  FileNotFoundError if this node has no key yet; KeyFileCorrupt/KeyFileUnsafe."""
        self._check_directory()
        self._discard_leftovers()
        current = self._read(self.directory / CURRENT)
        try:
            previous: PrivateKey | None = self._read(self.directory / PREVIOUS)
        except FileNotFoundError:
            previous = None
        return NodeKey(current, previous)

    def load_or_create(self) -> NodeKey:
        """The keys on disk; on a node without any, a new key (and the directory) created first."""
        if not self.directory.exists():
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.directory.mkdir(mode=0o700)
            except FileExistsError:
                pass
            else:
                os.chmod(self.directory, 0o700)  # whatever the umask
        try:
            return self.load()
        except FileNotFoundError as exc:
            if exc.filename is None or pathlib.Path(exc.filename) != self.directory / CURRENT:
                raise
        key = PrivateKey.generate()
        tmp = self._write_tmp(key)
        try:
            os.link(tmp, self.directory / CURRENT)  # fails if another writer got there first: theirs wins
        except FileExistsError:
            return self.load()
        finally:
            os.unlink(tmp)
        _fsync_dir(self.directory)
        log.info("WireGuard key created", extra={"public_key": key.public_key.base64, "dir": str(self.directory)})
        return self.load()

    def rotate(self) -> NodeKey:
        """A new key in use; the one before kept as ``private.key.previous``.  RotationPending while
        an earlier rotation's previous key is still kept."""
        before = self.load()
        if before.previous is not None:
            raise RotationPending(self.directory / PREVIOUS)
        key = PrivateKey.generate()
        tmp = self._write_tmp(key)
        os.rename(tmp, self.directory / NEXT)  # the new key, whole, beside the current one
        _fsync_dir(self.directory)
        os.link(self.directory / CURRENT, self.directory / PREVIOUS)
        os.rename(self.directory / NEXT, self.directory / CURRENT)  # the switch: one rename
        _fsync_dir(self.directory)
        log.info(
            "WireGuard key rotated",
            extra={"public_key": key.public_key.base64, "previous_public_key": before.public_key.base64},
        )
        return NodeKey(key, before.current)

    def forget_previous(self) -> NodeKey:
        """Drop the key kept from the last rotation (once every peer has the new public key)."""
        keys = self.load()
        if keys.previous is not None:
            os.unlink(self.directory / PREVIOUS)
            _fsync_dir(self.directory)
            log.info("WireGuard previous key forgotten", extra={"public_key": keys.previous.public_key.base64})
        return NodeKey(keys.current)

    def _check_directory(self) -> None:
        st = os.lstat(self.directory)
        if not stat.S_ISDIR(st.st_mode):
            raise KeyFileUnsafe(self.directory, "a directory", "a symlink or another file type")
        _check_owned_private(self.directory, st, "directory")

    def _discard_leftovers(self) -> None:
        for entry in os.scandir(self.directory):
            if entry.name == NEXT or entry.name.startswith(_TMP_PREFIX):
                os.unlink(entry.path)
                log.warning(
                    "an interrupted key write was discarded (that key was never in use)",
                    extra={"path": entry.path},
                )

    def _read(self, path: pathlib.Path) -> PrivateKey:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            if os.path.islink(path):
                raise KeyFileUnsafe(path, "a regular file", "a symlink") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise KeyFileUnsafe(path, "a regular file", "another file type")
            _check_owned_private(path, st, "file")
            data = os.read(fd, _MAX_FILE)
        finally:
            os.close(fd)
        text = data[:-1] if data.endswith(b"\n") else data
        try:
            return PrivateKey.from_base64(text.decode("ascii"))
        except (UnicodeDecodeError, InvalidKey):
            raise KeyFileCorrupt(path, f"{len(data)} bytes that are no key") from None

    def _write_tmp(self, key: PrivateKey) -> pathlib.Path:
        tmp = self.directory / f"{_TMP_PREFIX}{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, (key.reveal_base64() + "\n").encode("ascii"))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp
