"""The ``netpol`` stage's lab: one two-node lab with the upstream model, shared by
test_netpol_e2e.py and test_cnp_e2e.py (a session fixture, so one pytest run
brings up one lab for both), and ``model``: that lab, reset after each case."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from flock.testing.netpol import Lab, model_lab


@pytest.fixture(scope="session")
def netpol_lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("the NetworkPolicy e2e tests need root (network namespaces, nftables); CI runs as root")
    for tool in ("bird", "birdc", "nft"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: scripts/bootstrap installs bird2 and nftables")
    with model_lab() as lab:
        yield lab


@pytest.fixture
def model(netpol_lab: Lab) -> Iterator[Lab]:
    yield netpol_lab
    netpol_lab.reset()
