"""The one table that turns typed errors into CNI codes (flock.pods._cni_codes)."""

from __future__ import annotations

import ipaddress

import pytest

from flock import errors, faults
from flock.ipam import AddressConflict, AnnotationError, PoolExhausted
from flock.pods import (
    ADDRESS_EXHAUSTED,
    CHECK_FAILED,
    CNI_CODES,
    AddTimedOut,
    CheckFailed,
    ContainerInUse,
    InvalidCniArgs,
    InvalidNetworkConfig,
    NotReady,
    PodLookupFailed,
    PodNotFound,
    Unavailable,
    UnknownContainer,
    cni_error,
)
from flock.store import StoreError


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (NotReady("agent not ready", "waiting for NodeConfig host001"), errors.TRY_AGAIN_LATER),
        (AddTimedOut("ADD did not finish in time"), errors.TRY_AGAIN_LATER),
        (PodNotFound("pod not found"), errors.TRY_AGAIN_LATER),
        (PodLookupFailed("the API server did not answer"), errors.TRY_AGAIN_LATER),
        (Unavailable("address pool exhausted"), errors.NOT_AVAILABLE),
        (InvalidCniArgs("invalid CNI_ARGS"), errors.INVALID_ENV),
        (ContainerInUse("container ID already in use"), errors.INVALID_ENV),
        (UnknownContainer("unknown container"), errors.UNKNOWN_CONTAINER),
        (InvalidNetworkConfig("CHECK needs prevResult"), errors.INVALID_CONFIG),
        (CheckFailed("interface differs"), CHECK_FAILED),
        (AnnotationError("flock.fritzlab.net/ipv4", "maybe", "expected true or false"), errors.INVALID_CONFIG),
        (PoolExhausted(ipaddress.ip_network("198.51.100.0/29"), "all 5 taken"), ADDRESS_EXHAUSTED),
        (AddressConflict(ipaddress.ip_address("2001:db8::1"), "a", "b"), errors.INTERNAL),
        (faults.NetnsUnusable("network namespace not found", "netns='/x'"), errors.INVALID_ENV),
        (faults.IfNameTaken("interface already exists in the pod namespace"), errors.INVALID_ENV),
        (faults.AllocationUnusable("cannot plan pod network"), errors.INVALID_CONFIG),
        (faults.NodeUnprepared("uplink interface not found"), errors.INVALID_CONFIG),
        (faults.KernelRefused("netlink veth failed"), errors.IO_ERROR),
        (faults.PolicyNotEnforceable("NetworkPolicy cannot be enforced on this node yet"), errors.TRY_AGAIN_LATER),
        (StoreError("/var/lib/flock/flock.db", "allocation database failed", "disk I/O error"), errors.IO_ERROR),
    ],
)
def test_each_typed_error_has_its_code_and_keeps_msg_and_details(exc, code):
    err = cni_error(exc)
    assert (err.code, err.msg, err.details) == (code, exc.msg, exc.details)


def test_a_cni_error_keeps_its_code_and_anything_else_is_not_in_the_table():
    wire = errors.CniError(errors.INCOMPATIBLE_CNI_VERSION, "incompatible CNI version")
    assert cni_error(wire) is wire
    assert cni_error(KeyError("a bug")) is None


def test_every_fault_kind_has_a_row():
    kinds = {kind for kind, _ in CNI_CODES}
    leaves = [c for c in vars(faults).values() if isinstance(c, type) and issubclass(c, faults.Fault)]
    assert {c for c in leaves if c is not faults.Fault} <= kinds


def test_long_details_are_cut_at_the_boundary_not_in_the_domain():
    exc = faults.KernelRefused("netlink setup failed", "x" * 20_000)
    assert len(exc.details) > errors.MAX_DETAILS_BYTES
    assert errors.json_size(cni_error(exc).details) <= errors.MAX_DETAILS_BYTES


def test_an_annotation_value_is_quoted_as_a_bounded_prefix_where_it_is_named():
    # Issue 12: a 5,000-address annotation is named by its head and its size, in logs too.
    exc = AnnotationError("flock.fritzlab.net/anycast", "2001:db8::1," * 2000, "at most 64 addresses")
    assert exc.details.startswith("flock.fritzlab.net/anycast='2001:db8::1,2001:db8::1,")
    assert "(24000 characters)" in exc.details and len(exc.details) < 1024
