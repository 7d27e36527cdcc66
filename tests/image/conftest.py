"""The image stage's shared image: scripts/build-image builds deploy/Dockerfile once per
session into a fixed cache directory (``$FLOCK_IMAGE_TEST_DIR`` or
/var/cache/flock-image-build, so a re-run reuses the base rootfs, the wheels and
every unchanged layer); the image tests and the upgrade drill both run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = Path(os.environ.get("FLOCK_IMAGE_TEST_DIR", "/var/cache/flock-image-build"))
TAG = "flock:image-test"
BUILD_TIMEOUT_S = 1200


def _build(*args: str) -> subprocess.CompletedProcess[str]:
    """scripts/build-image ARGS --dir IMAGE_DIR --json."""
    return subprocess.run(
        [str(REPO / "scripts/build-image"), *args, "--dir", str(IMAGE_DIR), "--json"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )


@pytest.fixture(scope="session")
def build_image() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``build_image(*args)``: scripts/build-image ARGS into the stage's image directory, --json."""
    if os.geteuid() != 0:
        pytest.fail("the image tests need root (mmdebstrap, rootful podman, network namespaces); CI runs as root")
    for tool in ("podman", "runc", "mmdebstrap", "bird", "birdc"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run scripts/bootstrap (it installs podman, runc, mmdebstrap, bird2)")
    return _build


@pytest.fixture(scope="session")
def image(build_image: Callable[..., subprocess.CompletedProcess[str]]) -> Iterator[dict[str, Any]]:
    """This tree's image (scripts/build-image's JSON: image, id, size, dir, storage_conf, containers_conf…)."""
    out = build_image("--tag", TAG)
    if out.returncode != 0:
        pytest.fail(f"scripts/build-image failed:\n{out.stderr[-4000:]}")
    yield json.loads(out.stdout)
