"""Shared fixtures.

Tests that need root or bird2 never skip: CI is root and installs bird2, so a
missing requirement is a failure that says what is missing.
"""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture
def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces, veths); CI runs as root")


@pytest.fixture(scope="session")
def kubectl_path() -> str:
    """The machine's kubectl (a client flock did not write): every machine here has one, CI's included."""
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: these tests drive the fake API server with the real kubectl (v1.32)")
    return found


@pytest.fixture
def require_bird() -> None:
    for tool in ("bird", "birdc"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: install Debian's bird2 (scripts/bootstrap does)")


@pytest.fixture(scope="module")
def pod_netns_path():
    """A real network namespace (its /run/netns path) for CNI_NETNS: the shim opens it."""
    from flock.testing.netns import netns_pool

    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces); CI runs as root")
    with netns_pool("fl-pod-") as pool:
        yield pool.create("pod").path
