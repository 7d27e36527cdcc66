"""Packs the CNI shim into one self-contained executable file: a Python script.

The host that runs the plugin has python3 (3.8+) but not flock.  The file is
:mod:`flock.cni_fastpath` run directly (no zipapp: ``runpy`` alone costs
milliseconds at every pod start), after :mod:`flock.cni_common`, the
constants, limits and transport it shares with the rest of the shim and the
agent: both are inlined in the script as bytecode for the building
interpreter (marshalled code objects, used when the host python's magic
number matches; any other version compiles their source).  The other shim
modules are embedded in its ``_BUNDLE`` (source, and bytecode for the
building interpreter), imported from there only when the fast path hands
over to :mod:`flock.cni_shim` (errors, unreachable agent, DEL journal); they
find :mod:`flock.cni_common` already loaded, so the bundle holds one copy of
every value the shim and the agent share.
"""

from __future__ import annotations

import binascii
import importlib.util
import marshal
import os
import types
import zlib
from pathlib import Path

import flock

# Package-relative paths of every module the shim imports (tests check these
# lists against the shim's imports, so they cannot silently fall behind): the
# script's main module, those the loader runs before it (inlined beside it: the
# fast path imports them), and those imported off the fast path (from _BUNDLE).
MAIN_MODULE = "cni_fastpath.py"
BOOT_MODULES = ("cni_common.py",)
SHIM_MODULES = ("errors.py", "cni_shim.py", "rpc/wire.py", "rpc/cniresult.py")

_PACKAGE_INIT = '"""flock CNI plugin bundle: see flock.cni_fastpath."""\n'


def site_module(pending_deletes: str) -> bytes:
    """``flock/_site.py``: the installer's settings the shim reads (never a
    request's): where it journals DELs the agent could not take."""
    return f"PENDING_DELETES_DIR = {pending_deletes!r}\n".encode()


def bundled_sources(pending_deletes: str | None = None) -> dict[str, str]:
    """Module name -> source of every module embedded in the shim's ``_BUNDLE``
    (imported off the fast path; see :func:`boot_sources` for the others)."""
    sources = {"flock": _PACKAGE_INIT, "flock.rpc": _PACKAGE_INIT}
    if pending_deletes is not None:
        sources["flock._site"] = site_module(pending_deletes).decode()
    sources.update(_read(SHIM_MODULES))
    return sources


def boot_sources() -> tuple[tuple[str, str], ...]:
    """``(module name, source)`` of the modules the loader runs at every call,
    in order: :data:`BOOT_MODULES`, then :data:`MAIN_MODULE` (whose ``main()``
    it calls)."""
    return tuple(_read((*BOOT_MODULES, MAIN_MODULE)).items())


def _read(rels: tuple[str, ...]) -> dict[str, str]:
    package = Path(flock.__file__).parent
    return {"flock." + rel[:-3].replace("/", "."): (package / rel).read_text() for rel in rels}


# The script: a loader that runs flock.cni_common, then flock.cni_fastpath, each as a module of that
# name, from their bytecode when the host python is the building one (a main script is compiled at
# every run, a marshalled code object only loaded), else from their source.  Hex, not a bytes repr:
# a plain ASCII literal is what costs least to compile.  Their docstrings are left out (optimize=2:
# the literal is read at every call; neither module has an assert).
_LOADER = """import sys


def _boot():
    ext = sys.modules.get("_frozen_importlib_external")
    if getattr(ext, "MAGIC_NUMBER", None) == bytes.fromhex("{magic}"):
        from marshal import loads

        boot = loads(bytes.fromhex("{code}"))
    else:
        from binascii import a2b_base64
        from marshal import loads
        from zlib import decompress

        boot = [(name, compile(source, "<flock bundle>/" + name, "exec", dont_inherit=True, optimize=2))
                for name, source in loads(decompress(a2b_base64(_BUNDLE)))["boot"]]
    for name, code in boot:
        module = type(sys)(name)
        sys.modules[name] = module
        exec(code, module.__dict__)
    module._BUNDLE = _BUNDLE
    module.main()


_BUNDLE = "{bundle}"
_boot()
"""


def shim_archive(prefix: bytes = b"", pending_deletes: str | None = None) -> bytes:
    """*prefix* (the shebang line) + the loader script, the boot modules' and the fast path's
    bytecode and the other modules embedded, and the pending-deletes directory when given
    (else the shim's default)."""
    sources = bundled_sources(pending_deletes)
    boot = boot_sources()
    bundle = {
        "modules": sources,
        "packages": ("flock", "flock.rpc"),
        "magic": importlib.util.MAGIC_NUMBER,
        "code": {name: marshal.dumps(_compile(src, name)) for name, src in sources.items()},
        "boot": boot,
    }
    # marshal format 2 for the container (plain str/bytes/tuple/dict: any python 3 reads it), zlib'd and
    # base64'd: decoded only off the fast path.
    packed = binascii.b2a_base64(zlib.compress(marshal.dumps(bundle, 2), 9), newline=False).decode()
    script = _LOADER.format(
        magic=importlib.util.MAGIC_NUMBER.hex(),
        code=marshal.dumps(tuple((name, _compile(src, name, optimize=2)) for name, src in boot)).hex(),
        bundle=packed,
    )
    return prefix + script.encode()


def _compile(source: str, name: str, optimize: int = -1) -> types.CodeType:
    return compile(source, "<flock bundle>/" + name, "exec", dont_inherit=True, optimize=optimize)


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
