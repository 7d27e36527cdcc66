"""Earlier releases of flock, checked out of git history, for the tests that upgrade from (and roll
back to) them: a database written by the previous release's own code, its shim as installed on a host,
its agent.  Nothing here is hand-written to look like an old release; it *is* the old release's code.

Error handling: a checkout without the history (a shallow clone) raises :class:`MissingRelease`
naming the commit and how to get it; tests turn it into a failure with that message.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

# flock 0.1.0 as it was last on main before the allocation store's schema v2 (the network name and
# hostPort mappings on every row): store schema v1, wire protocol v2.
PREVIOUS_RELEASE = "44c051853a5b7f2ce880eaf0d52d1a566d08bafa"
REPO = Path(__file__).resolve().parents[2]


class MissingRelease(RuntimeError):
    pass


def checkout(ref: str, dest: Path, repo: Path = REPO) -> Path:
    """The ``flock`` package of *ref* extracted under *dest* (``dest/flock``); *dest* to put on PYTHONPATH."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", ref, "flock"],
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
