"""Field selectors as kube-apiserver parses them, for the fields flock filters on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ._status import StatusError

# Per resource kind, the fields kube-apiserver accepts in a fieldSelector.
SUPPORTED_FIELDS = {
    "Pod": ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"),
    "NodeConfig": ("metadata.name", "metadata.namespace"),
    "Secret": ("metadata.name", "metadata.namespace", "type"),
}


@attrs.frozen
class Requirement:
    field: str
    value: str
    equal: bool


@attrs.frozen
class FieldSelector:
    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None, kind: str) -> FieldSelector:
        """Parse ``a=b,c==d,e!=f``; unsupported fields or syntax → 400 like the real server."""
        if not text:
            return cls()
        reqs = []
        for term in text.split(","):
            if "!=" in term:
                field, value = term.split("!=", 1)
                equal = False
            elif "==" in term:
                field, value = term.split("==", 1)
                equal = True
            elif "=" in term:
                field, value = term.split("=", 1)
                equal = True
            else:
                raise StatusError(400, f"invalid field selector: {text!r}: term {term!r} has no operator")
            field = field.strip()
            if field not in SUPPORTED_FIELDS.get(kind, ()):
                raise StatusError(400, f'field label not supported: "{field}"')
            reqs.append(Requirement(field, value.strip(), equal))
        return cls(tuple(reqs))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, r.field) == r.value) == r.equal for r in self.requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return "" if cur is None else str(cur)
