"""An earlier release's manifests, out of git history, for the image lab's upgrade drill.

``flock-lab up --image OLD --manifest-ref GITREF`` runs an earlier release as it
was deployed: its own ``deploy/`` (DaemonSet, ConfigMaps), not today's with an
old image.  :func:`deploy_from_git` extracts that ``deploy/`` (``git archive``)
once per commit into a cache directory (the image build's, next to the image of
the same commit) and returns it.

Error handling: a ref that is not a commit of this checkout (a typo, a shallow
clone) or a commit without ``deploy/`` raises :class:`LabError` naming it and
what to do.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from flock.lab._state import LabError

REPO = Path(__file__).resolve().parents[2]
GIT_TIMEOUT_S = 60


def _git(repo: Path, *args: str) -> bytes:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, check=True, timeout=GIT_TIMEOUT_S
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise LabError(
            f"git {' '.join(args)} in {repo}: {exc.stderr.decode(errors='replace').strip()[:300]} "
            "(a ref of this checkout's history is needed; a shallow clone: git fetch --unshallow)"
        ) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"git {' '.join(args)} in {repo}: {exc}") from None


def resolve_commit(ref: str, repo: Path = REPO) -> str:
    """The full commit name of *ref* in *repo*."""
    return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").decode().strip()


def deploy_from_git(ref: str, cache: Path, repo: Path = REPO) -> Path:
    """*ref*'s ``deploy/`` as ``cache/<commit>/deploy`` (extracted once; blocking)."""
    commit = resolve_commit(ref, repo)
    dest = cache / commit / "deploy"
    if (dest / "kustomization.yaml").is_file():
        return dest
    archive = _git(repo, "archive", "--format=tar", commit, "deploy")
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}-", dir=cache))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(staging, filter="data")
        if not (staging / "deploy" / "kustomization.yaml").is_file():
            raise LabError(f"{ref} ({commit[:12]}) has no deploy/kustomization.yaml")
        (cache / commit).mkdir(exist_ok=True)
        try:
            os.rename(staging / "deploy", dest)
        except OSError:
            if not (dest / "kustomization.yaml").is_file():  # not another extraction's result
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
