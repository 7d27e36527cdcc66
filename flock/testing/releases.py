"""Earlier releases of flock, checked out of git history, for the tests that upgrade from (and roll
back to) them: a database written by the previous release's own code, its shim as installed on a host,
its agent.  Nothing here is hand-written to look like an old release; it *is* the old release's code.

- :func:`checkout` extracts a commit's ``flock`` package (and its ``pyproject.toml``, for the entry
  points) from git history;
- :func:`build_shim` writes the release's shim file with that release's own installer code (run in a
  subprocess with the checkout first on ``sys.path``): byte for byte what its ``flock-install-cni``
  puts on a host, with this interpreter in the shebang;
- :func:`agent_runner` is a *prefix* for :meth:`flock.testing.agentlab.Lab.agent` that runs the
  release's own ``flock-agent`` entry point (from its ``pyproject.toml``) with the flags the lab gives,
  the checkout first on ``sys.path``.  The venv's third-party packages serve both releases.

Error handling: a checkout without the history (a shallow clone) raises :class:`MissingRelease`
naming the commit and how to get it; tests turn it into a failure with that message.  A release whose
installer or entry points do not look as expected raises :class:`MissingRelease` too, saying what.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

# flock 0.1.0 as it was last on main before the allocation store's schema v2 (the network name and
# hostPort mappings on every row): store schema v1, wire protocol v2.
PREVIOUS_RELEASE = "44c051853a5b7f2ce880eaf0d52d1a566d08bafa"
# The last commit whose agent spoke wire protocol v1 only (the next, 3cb9769, brought v2: the pod's
# netns as an fd): what the shim's v1 fallback is for.  Its agent is ``flock.agent:main``.
WIRE_V1_AGENT = "261b9c461190f111943306f6a7912c0ac4e3d77d"
REPO = Path(__file__).resolve().parents[2]


class MissingRelease(RuntimeError):
    pass


def checkout(ref: str, dest: Path, repo: Path = REPO) -> Path:
    """The ``flock`` package of *ref* extracted under *dest* (``dest/flock``, and ``dest/pyproject.toml``
    for its entry points); *dest* to put on PYTHONPATH."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", ref, "flock", "pyproject.toml"],
            capture_output=True,
            check=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        stderr = getattr(exc, "stderr", b"") or b""
        raise MissingRelease(
            f"cannot read flock at {ref[:12]} from git history in {repo} ({stderr.decode(errors='replace').strip()[:200]}"
            f"{exc if not stderr else ''}): the upgrade tests need the full history (git fetch --unshallow)"
        ) from None
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


# Run with ``python -I -c``: isolated (no PYTHON* variables, no user site, not the current directory),
# so the release's package is the one imported, not this checkout's (the venv's editable install of
# this flock resolves only what sys.path does not).
_BOOT = "import sys\nsys.path.insert(0, {release!r})\n"

# What the release's ``install`` does for the shim: ``shim_bytes`` (its bundle behind ``#!<python> -IS``)
# written by ``write_atomic``.
_SHIM = """
import inspect
from pathlib import Path
from flock import installer
python, journal, dest = sys.argv[1:]
if journal and "pending_deletes" not in inspect.signature(installer.shim_bytes).parameters:
    sys.exit("this release's installer bakes no pending-deletes directory into the shim")
data = installer.shim_bytes(python, journal) if journal else installer.shim_bytes(python)
installer.write_atomic(Path(dest), data, 0o755)
"""

# sys.argv[1] is the program the lab would run (this flock's flock-agent), the rest its flags.
_AGENT = """
if len(sys.argv) < 2 or not sys.argv[1].endswith("/flock-agent"):
    sys.exit(f"expected flock-agent's command line after the runner, got {{sys.argv[1:2]}}")
sys.argv = sys.argv[1:]
from {module} import {function} as entry
sys.exit(entry())
"""


def build_shim(
    release: Path, dest: Path, *, python: str = sys.executable, pending_deletes: str | None = None
) -> list[str]:
    """Write *release*'s shim to *dest* (mode 0755) with its own ``flock.installer`` (``shim_bytes`` and
    ``write_atomic``, as its ``install`` does): ``#!<python> -IS`` and that release's modules.
    *pending_deletes*: its DEL journal directory, as that installer bakes it in (``<socket dir>/
    pending-deletes``).  Returns the argv that runs it."""
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            _BOOT.format(release=str(release)) + _SHIM,
            python,
            pending_deletes or "",
            str(dest),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise MissingRelease(f"the release in {release} could not build its shim: {done.stderr.strip()[-2000:]}")
    if not os.access(dest, os.X_OK):
        raise MissingRelease(f"the release in {release} wrote no executable shim at {dest}")
    return [str(dest)]


def entry_point(release: Path, script: str) -> tuple[str, str]:
    """``(module, function)`` of console script *script* in *release*'s ``pyproject.toml``."""
    try:
        spec = tomllib.loads((release / "pyproject.toml").read_text())["project"]["scripts"][script]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise MissingRelease(f"no {script} entry point in {release / 'pyproject.toml'}: {exc!r}") from None
    module, _, function = spec.partition(":")
    if not module or not function.isidentifier():
        raise MissingRelease(f"{script} = {spec!r} in {release / 'pyproject.toml'}: expected module:function")
    return module, function


def agent_runner(release: Path) -> list[str]:
    """A *prefix* for :meth:`flock.testing.agentlab.Lab.agent`: runs *release*'s own ``flock-agent``
    entry point (``python -I -c …``, the checkout first on sys.path) with the flags the lab passes; the
    lab's log, health and stop handling apply as to this release's agent."""
    module, function = entry_point(release, "flock-agent")
    code = _BOOT.format(release=str(release)) + _AGENT.format(module=module, function=function)
    return [sys.executable, "-I", "-c", code]
