"""Packs the CNI shim into one self-contained executable file (a zipapp).

The host that runs the plugin has python3 (3.8+) but not flock, so the file
carries :mod:`flock.cni_shim` and the standard-library modules it imports,
under package ``__init__`` files that import nothing.

Beside each source goes its bytecode for the building interpreter
(unchecked hash-based .pyc, PEP 552): a host python of the same minor version
skips compiling at every pod start; any other version ignores the .pyc (its
magic number differs) and compiles the source.
"""

from __future__ import annotations

import importlib.util
import io
import marshal
import os
import struct
import zipfile
from pathlib import Path

import flock

# Package-relative paths of every module the shim imports (tests check this
# list against the shim's imports, so it cannot silently fall behind).
SHIM_MODULES = ("errors.py", "cni_shim.py", "rpc/wire.py", "rpc/cniresult.py")

_MAIN = b"from flock.cni_shim import main\n\nmain()\n"
_PACKAGE_INIT = b'"""flock CNI plugin bundle: see flock.cni_shim."""\n'

# Fixed timestamps make the file identical for identical sources.
_EPOCH = (2020, 1, 1, 0, 0, 0)


def site_module(pending_deletes: str) -> bytes:
    """``flock/_site.py``: the installer's settings the shim reads (never a
    request's): where it journals DELs the agent could not take."""
    return f"PENDING_DELETES_DIR = {pending_deletes!r}\n".encode()


def shim_archive(prefix: bytes = b"", pending_deletes: str | None = None) -> bytes:
    """*prefix* (the shebang line) + a zip holding ``__main__`` and the shim's
    modules, and the pending-deletes directory when given (else the shim's default)."""
    package = Path(flock.__file__).parent
    members = {"__main__.py": _MAIN, "flock/__init__.py": _PACKAGE_INIT, "flock/rpc/__init__.py": _PACKAGE_INIT}
    if pending_deletes is not None:
        members["flock/_site.py"] = site_module(pending_deletes)
    for rel in SHIM_MODULES:
        members["flock/" + rel] = (package / rel).read_bytes()
    for name in [n for n in members if n.startswith("flock/")]:
        members[name + "c"] = _unchecked_pyc(members[name], name)
    buf = io.BytesIO()
    buf.write(prefix)
    # Stored, not deflated: nothing to decompress at each pod start.
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, members[name])
    return buf.getvalue()


def _unchecked_pyc(source: bytes, filename: str) -> bytes:
    code = compile(source, filename, "exec", dont_inherit=True)
    flags = 0b01  # hash-based, source not checked: the archive is immutable
    return (
        importlib.util.MAGIC_NUMBER
        + struct.pack("<I", flags)
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def build_shim(dest: Path, python: str = "/usr/bin/env python3", pending_deletes: str | None = None) -> None:
    """Write the executable shim to *dest* atomically (temp file, fsync, rename), mode 0755.

    *python* is the shebang's interpreter command, e.g. ``/usr/bin/python3 -IS``
    (one option word at most: the kernel passes the rest as a single argument).
    Errors (OSError) propagate; a failed build leaves *dest* untouched.
    """
    dest = Path(dest)
    data = shim_archive(prefix=b"#!" + python.encode() + b"\n", pending_deletes=pending_deletes)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o755)
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        # Clean up, then let the error (or cancellation) propagate.
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
