"""The shim ↔ agent wire protocol (standard library only).

The Trio server lives in :mod:`flock.rpc.server` and is imported explicitly,
so the shim can bundle this package without Trio or attrs.  The protocol's
constants have one home, :mod:`flock.cni_common`, shared with the shim.
"""

from flock.cni_common import PENDING_DELETES, PROTOCOL_VERSION
from flock.rpc.cniresult import LATEST_VERSION, SUPPORTED_VERSIONS, check_cni_version, convert_result, version_reply
from flock.rpc.wire import (
    MAX_LINE_BYTES,
    OPS,
    SPOKEN_VERSIONS,
    LineReader,
    Request,
    decode_response,
    encode_error,
    encode_result,
    field_error,
    parse_cni_args,
    valid_container_id,
    valid_if_name,
    valid_netns,
)

__all__ = [
    "LATEST_VERSION",
    "MAX_LINE_BYTES",
    "OPS",
    "PENDING_DELETES",
    "PROTOCOL_VERSION",
    "SPOKEN_VERSIONS",
    "SUPPORTED_VERSIONS",
    "LineReader",
    "Request",
    "check_cni_version",
    "convert_result",
    "decode_response",
    "encode_error",
    "encode_result",
    "field_error",
    "parse_cni_args",
    "valid_container_id",
    "valid_if_name",
    "valid_netns",
    "version_reply",
]
