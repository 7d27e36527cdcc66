"""Helpers for tests and the lab (real namespaces, never mocks)."""
