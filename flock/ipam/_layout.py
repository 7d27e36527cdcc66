"""ip-algo layouts: ``field:bits,…`` parsed into a frozen value.

A layout is laid out from the most significant host bit down.  Named fields
contribute the low ``bits`` of FNV-1a-64 of their string, ``random`` draws
fresh bits, ``n`` is a collision counter; host bits the layout leaves out are
random.  A layout with neither ``random`` nor ``n`` could never resolve a
collision and is rejected here, before any pod is seen.
"""

from __future__ import annotations

import attrs

NAMED_FIELDS = frozenset({"namespace", "app", "image", "pod", "node"})
RANDOM = "random"
COUNTER = "n"
FIELDS = NAMED_FIELDS | {RANDOM, COUNTER}
# A named field is the low bits of a 64-bit hash; more bits would be constant zeros.
MAX_NAMED_BITS = 64
MAX_BITS = 127


class LayoutError(ValueError):
    """An ip-algo string that is not a valid layout; ``reason`` says what is wrong."""

    def __init__(self, value: str, reason: str) -> None:
        self.value, self.reason = value, reason
        super().__init__(f"ip-algo {value!r}: {reason}")


@attrs.frozen
class LayoutField:
    name: str
    bits: int


@attrs.frozen
class Layout:
    fields: tuple[LayoutField, ...]
    text: str

    @property
    def bits(self) -> int:
        return sum(f.bits for f in self.fields)


def parse_layout(text: str) -> Layout:
    """Parse ``"namespace:16,app:16,random:32"``; raise :class:`LayoutError`."""
    fields = []
    seen: set[str] = set()
    items = text.split(",")
    if not text.strip():
        raise LayoutError(text, "expected a comma-separated list of field:bits")
    for item in items:
        name, sep, raw_bits = item.strip().partition(":")
        if not sep:
            raise LayoutError(text, f"{item.strip()!r} is not field:bits")
        if name not in FIELDS:
            raise LayoutError(text, f"unknown field {name!r} (expected one of {', '.join(sorted(FIELDS))})")
        if name in seen:
            raise LayoutError(text, f"field {name!r} appears twice")
        seen.add(name)
        # ASCII only and short: str.isdigit() also admits '²' and '١', which
        # int() refuses or reads, and a 5000-digit number overflows int().
        if not (raw_bits.isascii() and raw_bits.isdigit() and len(raw_bits) <= 3):
            raise LayoutError(text, f"{name}: bits {raw_bits!r} is not a positive integer")
        bits = int(raw_bits)
        limit = MAX_NAMED_BITS if name in NAMED_FIELDS else MAX_BITS
        if not 1 <= bits <= limit:
            raise LayoutError(text, f"{name}: {bits} bits is outside 1..{limit}")
        fields.append(LayoutField(name, bits))
    layout = Layout(tuple(fields), text)
    if RANDOM not in seen and COUNTER not in seen:
        raise LayoutError(text, "no room for uniqueness: add a 'random' or an 'n' field")
    if layout.bits > MAX_BITS:
        raise LayoutError(text, f"{layout.bits} bits in total, more than an IPv6 identifier can hold")
    return layout
