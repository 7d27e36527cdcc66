"""Label selectors, parsed, validated and matched as ``k8s.io/apimachinery/pkg/labels`` (1.32) does.

The syntax: requirements joined by ``,`` (AND), each one of ``k=v``, ``k==v``,
``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists), ``!k`` (does not
exist), ``k>n`` and ``k<n`` (integers); whitespace between tokens is free.  A
bad selector is a :class:`LabelSelectorError` whose message is upstream's
(``found ',', expected: identifier``, ``unable to parse requirement: …``);
the API server answers it 400 BadRequest.

An object's labels are kept as :data:`Labels` (sorted (key, value) pairs,
interned), the form :class:`flock.apiserver._lists.StoredObject` holds.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

Labels = tuple[tuple[str, str], ...]  # sorted (key, value) pairs

IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS = "in", "notin", "=", "==", "!="
EXISTS, DOES_NOT_EXIST, GREATER_THAN, LESS_THAN = "exists", "!", "gt", "lt"
_BINARY = (IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS, GREATER_THAN, LESS_THAN)

# The lexer's tokens (labels/selector.go's string2token), by their text.
_IDENTIFIER, _END, _COMMA, _OPEN, _CLOSE, _ERROR = "identifier", "end", ",", "(", ")", "error"
_SYMBOLS = {")": ")", ",": ",", "!": "!", "==": "==", "=": "=", ">": ">", "<": "<", "!=": "!=", "(": "("}
_KEYWORDS = {"in": IN, "notin": NOT_IN}
_SPECIAL = frozenset("=!(),><")
_SPACE = frozenset(" \t\r\n")

_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_FORMAT = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation "
    "is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_SUBDOMAIN_FORMAT = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_VALUE_FORMAT = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
    "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


class LabelSelectorError(ValueError):
    """A label selector that does not parse or validate; the message is kube-apiserver's."""


@attrs.frozen
class LabelRequirement:
    key: str
    operator: str  # one of IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS, EXISTS, DOES_NOT_EXIST, GT, LT
    values: tuple[str, ...] = ()  # sorted, distinct

    def matches(self, labels: Mapping[str, str]) -> bool:
        """``Requirement.Matches``: a missing label fails in, =, exists, gt and lt, passes the negations."""
        op = self.operator
        if op in (IN, EQUALS, DOUBLE_EQUALS):
            return self.key in labels and labels[self.key] in self.values
        if op in (NOT_IN, NOT_EQUALS):
            return self.key not in labels or labels[self.key] not in self.values
        if op == EXISTS:
            return self.key in labels
        if op == DOES_NOT_EXIST:
            return self.key not in labels
        value = _int64(labels.get(self.key))
        if value is None:
            return False
        limit = int(self.values[0])
        return value > limit if op == GREATER_THAN else value < limit

    @property
    def selects_values(self) -> tuple[str, ...] | None:
        """The values one of which the label must have (``=``, ``==``, ``in``): an index serves it."""
        return self.values if self.operator in (IN, EQUALS, DOUBLE_EQUALS) else None


@attrs.frozen
class LabelSelector:
    """Requirements, all of which an object's labels must meet (none: everything)."""

    requirements: tuple[LabelRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        """``labels.Parse``; raises :class:`LabelSelectorError` with upstream's message."""
        if not text:
            return cls()
        return cls(tuple(sorted(_Parser(text).parse(), key=lambda r: r.key)))

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, labels: Labels | Mapping[str, str]) -> bool:
        if not self.requirements:
            return True
        found = labels if isinstance(labels, Mapping) else dict(labels)
        return all(r.matches(found) for r in self.requirements)

    def indexable(self) -> LabelRequirement | None:
        """A requirement naming the values its label must have (the fewest), if any."""
        candidates = [r for r in self.requirements if r.selects_values is not None]
        return min(candidates, key=lambda r: len(r.values)) if candidates else None


EVERYTHING = LabelSelector()


def object_labels(obj: Mapping[str, Any]) -> Labels:
    """*obj*'s ``metadata.labels`` as sorted, interned (key, value) pairs."""
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping) or not labels:
        return ()
    return tuple(sorted((sys.intern(str(k)), sys.intern(str(v))) for k, v in labels.items()))


def _int64(text: str | None) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64), None when it fails."""
    if text is None or not re.fullmatch(r"[+-]?[0-9]+", text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    """The lexer: (token, literal) pairs, then (_END, "")."""
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _SPACE:
            i += 1
        if i >= n:
            yield _END, ""
            return
        if text[i] in _SPECIAL:
            # The longest run of special symbols that is a token.
            j, best = i, None
            while j < n and text[j] in _SPECIAL:
                j += 1
                if text[i:j] in _SYMBOLS:
                    best = j
                elif best is not None:
                    break
            if best is None:
                yield _ERROR, f"error expected: keyword found '{text[i:j]}'"
                return
            yield _SYMBOLS[text[i:best]], text[i:best]
            i = best
            continue
        j = i
        while j < n and text[j] not in _SPACE and text[j] not in _SPECIAL:
            j += 1
        word = text[i:j]
        yield _KEYWORDS.get(word, _IDENTIFIER), word
        i = j


class _Parser:
    """labels/selector.go's Parser: lookahead and consume in the two modes (in the values mode
    ``in`` and ``notin`` are identifiers)."""

    def __init__(self, text: str) -> None:
        self.items = list(_tokens(text))
        self.position = 0

    def lookahead(self, values: bool = True) -> tuple[str, str]:
        token, literal = self.items[min(self.position, len(self.items) - 1)]
        if values and token in (IN, NOT_IN):
            token = _IDENTIFIER
        return token, literal

    def consume(self, values: bool = True) -> tuple[str, str]:
        found = self.lookahead(values)
        self.position += 1
        return found

    def parse(self) -> list[LabelRequirement]:
        requirements: list[LabelRequirement] = []
        while True:
            token, literal = self.lookahead()
            if token == _END:
                return requirements
            if token not in (_IDENTIFIER, "!"):
                raise LabelSelectorError(f"found '{literal}', expected: !, identifier, or 'end of string'")
            try:
                requirements.append(self.requirement())
            except LabelSelectorError as err:
                raise LabelSelectorError(f"unable to parse requirement: {err}") from None
            token, literal = self.consume()
            if token == _END:
                return requirements
            if token != _COMMA:
                raise LabelSelectorError(f"found '{literal}', expected: ',' or 'end of string'")
            after, literal = self.lookahead()
            if after not in (_IDENTIFIER, "!"):
                raise LabelSelectorError(f"found '{literal}', expected: identifier after ','")

    def requirement(self) -> LabelRequirement:
        operator = ""
        token, literal = self.consume()
        if token == "!":
            operator = DOES_NOT_EXIST
            token, literal = self.consume()
        if token != _IDENTIFIER:
            raise LabelSelectorError(f"found '{literal}', expected: identifier")
        key = literal
        if problem := _key_problem(key, "<nil>"):
            raise LabelSelectorError(problem)
        if operator == DOES_NOT_EXIST or self.lookahead()[0] in (_END, _COMMA):
            return _requirement(key, operator or EXISTS, ())
        token, literal = self.consume(values=False)
        operators = {IN: IN, NOT_IN: NOT_IN, "=": EQUALS, "==": DOUBLE_EQUALS, "!=": NOT_EQUALS}
        operators.update({">": GREATER_THAN, "<": LESS_THAN})
        if token not in operators:
            raise LabelSelectorError(f"found '{literal}', expected: {', '.join(_BINARY)}")
        operator = operators[token]
        values = self.set_values() if operator in (IN, NOT_IN) else self.exact_value()
        return _requirement(key, operator, tuple(sorted(values)))

    def set_values(self) -> set[str]:
        token, literal = self.consume()
        if token != _OPEN:
            raise LabelSelectorError(f"found '{literal}' expected: '('")
        token, literal = self.lookahead()
        if token == _CLOSE:
            self.consume()
            return {""}
        if token not in (_IDENTIFIER, _COMMA):
            raise LabelSelectorError(f"found '{literal}', expected: ',', ')' or identifier")
        values = self.identifiers()
        if self.consume()[0] != _CLOSE:
            raise LabelSelectorError(f"found '{literal}', expected: ')'")
        return values

    def identifiers(self) -> set[str]:
        values: set[str] = set()
        while True:
            token, literal = self.consume()
            if token == _IDENTIFIER:
                values.add(literal)
                after, literal = self.lookahead()
                if after == _CLOSE:
                    return values
                if after != _COMMA:
                    raise LabelSelectorError(f"found '{literal}', expected: ',' or ')'")
            elif token == _COMMA:
                if not values:
                    values.add("")  # "(,"
                after, _ = self.lookahead()
                if after == _CLOSE:
                    values.add("")  # ",)"
                    return values
                if after == _COMMA:
                    self.consume()
                    values.add("")  # ",,"
            else:
                raise LabelSelectorError(f"found '{literal}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        token, _ = self.lookahead()
        if token in (_END, _COMMA):
            return {""}
        token, literal = self.consume()
        if token == _IDENTIFIER:
            return {literal}
        raise LabelSelectorError(f"found '{literal}', expected: identifier")


def _requirement(key: str, operator: str, values: tuple[str, ...]) -> LabelRequirement:
    """``NewRequirement``'s checks: every problem, as field errors (one alone, several in brackets)."""
    problems = []
    if problem := _key_problem(key, "key"):
        problems.append(problem)
    if operator in (IN, NOT_IN) and not values:
        problems.append("values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty")
    if operator in (GREATER_THAN, LESS_THAN):
        problems.extend(
            f"values[{i}]: Invalid value: \"{v}\": for 'Gt', 'Lt' operators, the value must be an integer"
            for i, v in enumerate(values)
            if _int64(v) is None
        )
    for i, value in enumerate(values):
        why = []
        if len(value) > 63:
            why.append("must be no more than 63 characters")
        if not _LABEL_VALUE.match(value):
            why.append(_VALUE_FORMAT)
        if why:
            problems.append(f'values[{i}][{key}]: Invalid value: "{value}": {"; ".join(why)}')
    if len(problems) == 1:
        raise LabelSelectorError(problems[0])
    if problems:
        raise LabelSelectorError("[" + ", ".join(problems) + "]")
    return LabelRequirement(key, operator, values)


def _key_problem(key: str, path: str) -> str | None:
    """``validation.IsQualifiedName`` as a field error at *path*, or None."""
    why = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            why.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                why.append("prefix part must be no more than 253 characters")
            if not _DNS_SUBDOMAIN.match(prefix):
                why.append("prefix part " + _SUBDOMAIN_FORMAT)
    else:
        why.append(
            "a qualified name "
            + _NAME_FORMAT
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        )
        name = None
    if name is not None:
        if not name:
            why.append("name part must be non-empty")
        elif len(name) > 63:
            why.append("name part must be no more than 63 characters")
        if name and not _NAME_PART.match(name):
            why.append("name part " + _NAME_FORMAT)
    return f'{path}: Invalid value: "{key}": {"; ".join(why)}' if why else None


__all__ = ["EVERYTHING", "LabelRequirement", "LabelSelector", "LabelSelectorError", "Labels", "object_labels"]
