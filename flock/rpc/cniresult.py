"""CNI versions flock speaks, and conversion of an ADD result to the one asked for.

The agent builds every result in the 1.1.0 form; the shim converts it to the
``cniVersion`` of the network configuration, as libcni's ``types/*`` do:

- 0.3.0, 0.3.1, 0.4.0: each ip carries ``version`` ("4" or "6"); interfaces
  are ``name``/``mac``/``sandbox``; routes are ``dst``/``gw``.
- 1.0.0: ``version`` is dropped from ips; same interface and route fields.
- 1.1.0: adds interface ``mtu``/``socketPath``/``pciID`` and route
  ``mtu``/``advmss``/``priority``/``table``/``scope``.

Fields a version does not define are dropped.  The versions and the
conversion itself are :mod:`flock.cni_common`'s (the shim's fast path
converts without importing this module); this one words what goes wrong as
CNI errors.  Standard library only, Python 3.8 syntax (bundled into the shim).
"""

from __future__ import annotations

from flock.cni_common import LATEST_VERSION, SUPPORTED_VERSIONS, MalformedResult
from flock.cni_common import convert_result as _convert_result
from flock.errors import DECODE_ERROR, INCOMPATIBLE_CNI_VERSION, CniError, quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def check_cni_version(config: dict[str, Any]) -> str:
    """The configuration's ``cniVersion`` if flock supports it, else CniError code 1."""
    version = config.get("cniVersion")
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            INCOMPATIBLE_CNI_VERSION,
            "incompatible CNI version",
            "cniVersion={}; flock supports {}".format(quote(version), ", ".join(SUPPORTED_VERSIONS)),
        )
    return version


def version_reply(requested: object) -> dict[str, Any]:
    """The VERSION command's answer (CNI spec 1.1, "VERSION")."""
    return {
        "cniVersion": requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION,
        "supportedVersions": list(SUPPORTED_VERSIONS),
    }


def convert_result(result: dict[str, Any], to_version: str) -> dict[str, Any]:
    """A 1.1.0-form ADD result rewritten for *to_version* (one of SUPPORTED_VERSIONS).

    Raises CniError code 1 for a version flock does not support, code 6 when
    ``interfaces``, ``ips`` or ``routes`` is not a list of objects.
    """
    if to_version not in SUPPORTED_VERSIONS:
        check_cni_version({"cniVersion": to_version})
    try:
        return _convert_result(result, to_version)
    except MalformedResult as exc:
        raise CniError(
            DECODE_ERROR, "malformed result", f"field {exc.key!r}={quote(exc.value)}: expected a list of objects"
        ) from None
