"""FNV-1a hashes: stable, dependency-free; ip-algo fields (64-bit) and host veth names (32-bit)."""

from __future__ import annotations

_OFFSET_64 = 0xCBF29CE484222325
_PRIME_64 = 0x100000001B3
_OFFSET_32 = 0x811C9DC5
_PRIME_32 = 0x01000193
_MASK_64 = (1 << 64) - 1
_MASK_32 = (1 << 32) - 1


def fnv1a_64(text: str) -> int:
    """FNV-1a-64 of the UTF-8 bytes of *text*."""
    h = _OFFSET_64
    for byte in text.encode():
        h = ((h ^ byte) * _PRIME_64) & _MASK_64
    return h


def fnv1a_32(text: str) -> int:
    """FNV-1a-32 of the UTF-8 bytes of *text* (host veth names use it)."""
    h = _OFFSET_32
    for byte in text.encode():
        h = ((h ^ byte) * _PRIME_32) & _MASK_32
    return h
