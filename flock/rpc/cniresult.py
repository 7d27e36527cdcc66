"""CNI versions flock speaks, and conversion of an ADD result to the one asked for.

The agent builds every result in the 1.1.0 form; the shim converts it to the
``cniVersion`` of the network configuration, as libcni's ``types/*`` do:

- 0.3.0, 0.3.1, 0.4.0: each ip carries ``version`` ("4" or "6"); interfaces
  are ``name``/``mac``/``sandbox``; routes are ``dst``/``gw``.
- 1.0.0: ``version`` is dropped from ips; same interface and route fields.
- 1.1.0: adds interface ``mtu``/``socketPath``/``pciID`` and route
  ``mtu``/``advmss``/``priority``/``table``/``scope``.

Fields a version does not define are dropped.  Standard library only,
Python 3.8 syntax (bundled into the shim).
"""

from __future__ import annotations

from flock.errors import DECODE_ERROR, INCOMPATIBLE_CNI_VERSION, CniError, quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]

_LEGACY = ("0.3.0", "0.3.1", "0.4.0")
_INTERFACE_FIELDS_1_0 = ("name", "mac", "sandbox")
_INTERFACE_FIELDS_1_1 = (*_INTERFACE_FIELDS_1_0, "mtu", "socketPath", "pciID")
_ROUTE_FIELDS_1_0 = ("dst", "gw")
_ROUTE_FIELDS_1_1 = (*_ROUTE_FIELDS_1_0, "mtu", "advmss", "priority", "table", "scope")
_IP_FIELDS = ("address", "gateway", "interface")


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
    legacy = to_version in _LEGACY
    newest = to_version == "1.1.0"
    out = {"cniVersion": to_version}  # type: dict[str, Any]
    if "interfaces" in result:
        iface_fields = _INTERFACE_FIELDS_1_1 if newest else _INTERFACE_FIELDS_1_0
        out["interfaces"] = [_pick(iface, iface_fields) for iface in _objects(result, "interfaces")]
    if "ips" in result:
        ips = []
        for ip in _objects(result, "ips"):
            item = _pick(ip, _IP_FIELDS)
            if legacy:
                item["version"] = "6" if ":" in str(ip.get("address", "")) else "4"
            ips.append(item)
        out["ips"] = ips
    if "routes" in result:
        route_fields = _ROUTE_FIELDS_1_1 if newest else _ROUTE_FIELDS_1_0
        out["routes"] = [_pick(route, route_fields) for route in _objects(result, "routes")]
    if "dns" in result:
        out["dns"] = result["dns"]
    return out


def _objects(result: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """``result[key]`` if it is a list of objects, else CniError code 6 naming it
    (the result crossed the wire: a broken agent must not crash the shim)."""
    items = result[key]
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise CniError(DECODE_ERROR, "malformed result", f"field {key!r}={quote(items)}: expected a list of objects")
    return items


def _pick(obj: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: obj[k] for k in keys if k in obj}
