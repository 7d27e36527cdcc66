"""The README and docs/ hold only what is true of this tree.

Main suite (cheap, no root): every command line a fenced block shows for
``flock-lab``, ``flockctl``, ``flock-agent`` or ``flock-install-cni`` parses
against that program's real argparse (its subcommand and flags exist), and
every ``kubectl`` line names a kubectl verb (``kubectl exec … -- flockctl …``
is checked as flockctl); the NodeConfig table of docs/install.md names
exactly the fields of the CRD's ``openAPIV3Schema``, with their types,
defaults, ranges and required fields; every ``flock_…`` metric the docs name
exists in flock/; every relative link and anchor resolves; the README keeps the
two commands, and .ci/run runs its test command.

``netpol`` stage (root, a real lab, about a minute): the README's five-minute
tour, its ``sh`` blocks run in order as one shell script, as a reader pastes
them.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from flock.agent._cli import parse_args as agent_parse_args
from flock.ctl._cli import parser as flockctl_parser
from flock.installer import parse_args as installer_parse_args
from flock.lab.cli import build_parser as flock_lab_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "deploy" / "README.md"]
CRD = ROOT / "deploy" / "crd-nodeconfig.yaml"
TOUR = "A five-minute tour of the lab"
TWO_COMMANDS = (
    "scripts/bootstrap && .venv/bin/flock-lab demo",
    "scripts/bootstrap && .venv/bin/python -m pytest",
)
# Blocks whose every line is a command; in any other block only a line shown with a `$ ` prompt is.
SHELL_LANGS = ("sh", "bash", "shell", "console")
SEPARATORS = (";", "&&", "||", "|", "&")
KEYWORDS = ("do", "then", "else", "!", "time")  # what may come before a command on a shell line
COMPOUND = ("for", "done", "if", "fi", "while", "case", "esac")  # lines that are no command of ours

# kubectl's verbs (kubectl 1.32 `kubectl --help`), enough to catch a typo or a flag where a verb goes.
KUBECTL_VERBS = frozenset(
    [
        "annotate",
        "api-resources",
        "api-versions",
        "apply",
        "attach",
        "auth",
        "autoscale",
        "certificate",
        "cluster-info",
        "completion",
        "config",
        "cordon",
        "cp",
        "create",
        "debug",
        "delete",
        "describe",
        "diff",
        "drain",
        "edit",
        "events",
        "exec",
        "explain",
        "expose",
        "get",
        "kustomize",
        "label",
        "logs",
        "patch",
        "plugin",
        "port-forward",
        "proxy",
        "replace",
        "rollout",
        "run",
        "scale",
        "set",
        "taint",
        "top",
        "uncordon",
        "version",
        "wait",
    ]
)

# kubectl's global flags that take a value as the next word (kubectl options).
KUBECTL_VALUE_FLAGS = frozenset(
    ("-n", "--namespace", "-s", "--server", "--kubeconfig", "--context", "--cluster", "--user", "--as", "-v")
)

# ---- reading markdown ------------------------------------------------------------------------------


@attrs.frozen
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    lines: tuple[str, ...]
    section: str  # the nearest heading above it


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown page."""
    out: list[Block] = []
    section, fence, lang, start, body = "", "", "", 0, []  # type: ignore[var-annotated]
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and not stripped[len(fence) :].strip():
                out.append(Block(path, start, lang, tuple(body), section))
                fence = ""
            else:
                body.append(line)
            continue
        if m := re.match(r"(`{3,}|~{3,})\s*([\w+-]*)", stripped):
            fence, lang, start, body = m.group(1), m.group(2).lower(), number, []
        elif m := re.match(r"#{1,6}\s+(.*)", line):
            section = m.group(1).strip()
    assert not fence, f"{path}: a code block opened on line {start} is never closed"
    return out


def headings(path: Path) -> list[str]:
    """The headings of a page, outside code blocks."""
    found, fence = [], False
    for line in path.read_text().splitlines():
        if re.match(r"\s*(`{3,}|~{3,})", line):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6}\s+(.*)", line)):
            found.append(m.group(1).strip())
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


# ---- command lines ---------------------------------------------------------------------------------


@attrs.frozen
class Command:
    where: str  # path:line
    argv: tuple[str, ...]


def shell_lines(block: Block) -> Iterator[tuple[int, str]]:
    """The command lines of *block* (continuations joined, ``$ `` prompts removed), with line numbers."""
    every = block.lang in SHELL_LANGS
    pending, first = "", 0
    for offset, raw in enumerate(block.lines, 1):
        line = raw.rstrip()
        if not pending:
            if line.lstrip().startswith("$ "):
                line = line.lstrip()[2:]
            elif not every:
                continue
            first = block.line + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield first, pending + line
        pending = ""


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)  # '#' starts a comment
    lexer.whitespace_split = True
    return list(lexer)


def commands(block: Block) -> Iterator[Command]:
    """Every simple command of *block*'s lines: split at ; && || | &, command substitutions
    ``$(…)`` taken out as commands of their own, ``NAME=value`` assignments followed into
    later ``$NAME``s (any other variable stands for its own name), redirections dropped."""
    variables: dict[str, str] = {}
    for number, line in shell_lines(block):
        where = f"{block.path.relative_to(ROOT)}:{number}"
        try:
            tokens = _tokens(line)
        except ValueError as exc:
            raise AssertionError(f"{where}: not a shell line ({exc}): {line!r}") from None
        pieces: list[list[str]] = []
        current: list[str] = []
        substituted: list[list[str]] = []
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.endswith("$") and i + 1 < len(tokens) and tokens[i + 1] == "(":
                depth, j = 1, i + 2
                while j < len(tokens) and depth:
                    depth += {"(": 1, ")": -1}.get(tokens[j], 0)
                    j += 1
                assert depth == 0, f"{where}: unbalanced $( in {line!r}"
                substituted.append(tokens[i + 2 : j - 1])
                current.append(tok[:-1] + "SUBSTITUTED")
                i = j
                continue
            if tok in SEPARATORS:
                pieces.append(current)
                current = []
            elif tok in ("<", ">", ">>", "2>"):
                i += 1  # and its target
            elif tok not in ("(", ")"):
                current.append(tok)
            i += 1
        pieces.append(current)
        pieces.extend(substituted)
        for piece in pieces:
            argv = [_expand(t, variables) for t in piece]
            while argv and argv[0] in KEYWORDS:
                argv.pop(0)
            if not argv or argv[0] in COMPOUND:
                continue
            if argv[0] == "export":
                argv.pop(0)
            assignments = 0
            for word in argv:
                if not (m := re.fullmatch(r"([A-Za-z_]\w*)=(.*)", word)):
                    break
                variables[m.group(1)] = m.group(2)
                assignments += 1
            if argv[assignments:]:
                yield Command(where, tuple(argv[assignments:]))


def _expand(token: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables.get(m.group(1), m.group(1).lower()), token)


def all_commands() -> list[Command]:
    return [c for page in PAGES for b in blocks(page) for c in commands(b)]


# ---- what each program accepts -------------------------------------------------------------------


def _argparse(parse: Callable[[list[str]], Any]) -> Callable[[Sequence[str]], str | None]:
    """A checker: None when *parse* takes the arguments, else argparse's complaint."""

    def check(args: Sequence[str]) -> str | None:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parse(list(args))
        except SystemExit as exc:
            if exc.code not in (0, None):
                return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
        return None

    return check


def _python_module(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    if len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1] == "-m":
        return argv[2], list(argv[3:])
    return None


CHECKERS: dict[str, Callable[[Sequence[str]], str | None]] = {
    "flock-lab": _argparse(lambda a: flock_lab_parser().parse_args(a)),
    "flockctl": _argparse(lambda a: flockctl_parser().parse_args(a)),
    "flock-agent": _argparse(lambda a: agent_parse_args(a, {})),
    "flock-install-cni": _argparse(installer_parse_args),
}
MODULES = {"flock.lab.cli": "flock-lab", "flock.ctl": "flockctl", "flock.ctl._cli": "flockctl"}


def check_command(argv: Sequence[str]) -> tuple[str, str | None] | None:
    """(program, complaint or None) for a command of ours; None for any other program."""
    program, args = Path(argv[0]).name, list(argv[1:])
    if (module := _python_module(argv)) is not None and module[0] in MODULES:
        program, args = MODULES[module[0]], module[1]
    if program in CHECKERS:
        return program, CHECKERS[program](args)
    if program != "kubectl":
        return None
    if "--" in args:  # kubectl exec … -- COMMAND: COMMAND is checked as what it is
        inner = args[args.index("--") + 1 :]
        args = args[: args.index("--")]
        if inner and (found := check_command(inner)) is not None and found[1] is not None:
            return found
    verb, rest = None, iter(args)
    for arg in rest:
        if arg in KUBECTL_VALUE_FLAGS:
            next(rest, None)
        elif not arg.startswith("-"):
            verb = arg
            break
    if verb not in KUBECTL_VERBS:
        return program, f"{verb!r} is not a kubectl verb"
    return program, None


def test_every_command_of_ours_parses() -> None:
    checked: dict[str, int] = {}
    problems = []
    for command in all_commands():
        found = check_command(command.argv)
        if found is None:
            continue
        program, complaint = found
        checked[program] = checked.get(program, 0) + 1
        if complaint is not None:
            problems.append(f"{command.where}: {shlex.join(command.argv)}\n    {complaint}")
    assert not problems, "command lines the real programs refuse:\n" + "\n".join(problems)
    # The pages do show these; a reader that finds nothing would pass anything.
    assert checked.get("flock-lab", 0) >= 30 and checked.get("flockctl", 0) >= 8 and checked.get("kubectl", 0) >= 8
    assert checked.get("flock-agent", 0) >= 1


def test_the_checker_catches_what_does_not_exist() -> None:
    """The checks themselves: a missing flag, a missing subcommand, a wrong verb; a comment is no argument."""
    block = Block(
        ROOT / "README.md",
        1,
        "sh",
        (
            "L=.venv/bin/flock-lab",
            "$L up --nodes 2 --no-such-flag   # a comment with --another-flag and it's fine",
            "export KUBECONFIG=$(.venv/bin/flock-lab kubeconfg)",
            "kubectl -n kube-system exec ds/flock -c flock-agent -- flockctl ipam free 10.0.0.1",
            "kubectl gte pods; .venv/bin/flockctl status --json",
            "for ns in x y; do $L ns add $ns --label ns=$ns; done",
        ),
        "",
    )
    found = [(c.argv, check_command(c.argv)) for c in commands(block)]
    complaints = [(argv[0], result[1]) for argv, result in found if result is not None and result[1]]
    assert [argv for argv, _ in complaints] == [".venv/bin/flock-lab", ".venv/bin/flock-lab", "kubectl", "kubectl"]
    assert "--no-such-flag" in str(complaints[0][1]) and "--another-flag" not in str(complaints[0][1])
    assert "kubeconfg" in str(complaints[1][1]) and "'free'" in str(complaints[2][1])
    assert found[-1][0][1:] == ("ns", "add", "ns", "--label", "ns=ns")


# ---- NodeConfig, field by field --------------------------------------------------------------------


@attrs.frozen
class Field:
    type: str
    required: bool
    default: Any = None
    minimum: Any = None
    maximum: Any = None


def schema_fields() -> dict[str, Field]:
    """Every field under ``spec`` of the NodeConfig CRD's schema, by path (``[]`` for a list's items)."""
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]
    fields: dict[str, Field] = {}

    def walk(node: dict[str, Any], path: str, required: bool) -> None:
        kind = node["type"]
        if kind == "array":
            kind = f"list of {node['items']['type']}"
        fields[path] = Field(kind, required, node.get("default"), node.get("minimum"), node.get("maximum"))
        if node["type"] == "array":
            node, path = node["items"], path + "[]"
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}", name in (node.get("required") or ()))

    walk(root["properties"]["spec"], "spec", "spec" in root["required"])
    return fields


def documented_fields() -> dict[str, tuple[str, str]]:
    """The NodeConfig table of docs/install.md: path → (type, "required / default" cell)."""
    text = (ROOT / "docs" / "install.md").read_text()
    m = re.search(r"<!-- nodeconfig-fields: begin -->\n(.*?)<!-- nodeconfig-fields: end -->", text, re.S)
    assert m, "docs/install.md: the NodeConfig table's markers are missing"
    rows: dict[str, tuple[str, str]] = {}
    for line in m.group(1).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        path = cells[0].strip("`")
        assert path not in rows, f"docs/install.md: {path} is listed twice"
        rows[path] = (cells[1], cells[2])
    return rows


def _number(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_nodeconfig_table_is_the_crd_schema() -> None:
    schema, doc = schema_fields(), documented_fields()
    assert sorted(set(schema) - set(doc)) == [], "fields of the CRD missing from docs/install.md"
    assert sorted(set(doc) - set(schema)) == [], "fields docs/install.md names that the CRD does not have"
    problems = []
    for path, field in schema.items():
        kind, constraints = doc[path]
        if kind != field.type:
            problems.append(f"{path}: type {kind!r}, the schema says {field.type!r}")
        if field.required != ("required" in constraints):
            problems.append(f"{path}: required is {field.required} in the schema; the doc says {constraints!r}")
        if field.default is not None and f"default `{_number(field.default)}`" not in constraints:
            problems.append(f"{path}: the schema's default is {_number(field.default)}; the doc says {constraints!r}")
        if field.default is None and "default" in constraints:
            problems.append(f"{path}: the schema has no default; the doc says {constraints!r}")
        if field.minimum is not None and f"{field.minimum}–{field.maximum}" not in constraints:
            problems.append(
                f"{path}: the schema's range is {field.minimum}–{field.maximum}; the doc says {constraints!r}"
            )
    assert not problems, "\n".join(problems)


# ---- metrics, links, the two commands -------------------------------------------------------------


def test_every_metric_named_exists() -> None:
    source = "\n".join(p.read_text() for p in (ROOT / "flock").rglob("*.py"))
    named = {m for page in PAGES for m in re.findall(r"\bflock_[a-z0-9_]+", page.read_text())}
    missing = sorted(name for name in named if re.sub(r"_(total|bucket|count|sum|created)$", "", name) not in source)
    assert named and missing == [], f"named in the docs, found nowhere in flock/: {missing}"


def test_links_resolve() -> None:
    problems = []
    for page in PAGES:
        text = re.sub(r"(?ms)^\s*(`{3,}).*?^\s*\1\s*$", "", page.read_text())  # not inside code blocks
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, fragment = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                problems.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in {anchor(h) for h in headings(dest)}:
                problems.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert not problems, "\n".join(problems)


def test_readme_is_the_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250, "the README is the front door: the rest belongs in docs/"
    shown = [b.lines for b in blocks(README) if b.lang == "sh"]
    for command in TWO_COMMANDS:
        assert (command,) in shown, f"the README no longer shows {command!r} on its own"
    assert TWO_COMMANDS[1] in (ROOT / ".ci" / "run").read_text().splitlines(), ".ci/run runs the README's test command"
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", text))
    assert {p.name for p in DOCS} - {"README.md"} <= linked, "every chapter is linked from the README"


# ---- the tour, on a real lab (netpol stage) --------------------------------------------------------


def tour_script() -> str:
    """The README's tour: its sh blocks, in order, as one script."""
    found = [b for b in blocks(README) if b.section == TOUR]
    assert found and all(b.lang == "sh" for b in found), f"the README's {TOUR!r} has no sh blocks"
    return "\n".join(line for b in found for line in b.lines) + "\n"


def test_tour_script_is_what_the_readme_shows() -> None:
    script = tour_script()
    assert script.startswith(".venv/bin/flock-lab up") and ".venv/bin/flock-lab down" in script.splitlines()[-1]
    assert "kubectl apply -f docs/examples/web-allow.yaml" in script


@pytest.mark.netpol
def test_readme_tour_runs_on_a_lab() -> None:
    if os.geteuid() != 0:
        pytest.fail("the tour needs root (network namespaces, veths, nftables); CI runs as root")
    for tool in ("bird", "birdc", "nft", "ping", "kubectl"):
        if shutil.which(tool) is None:
            pytest.fail(
                f"{tool} not found: scripts/bootstrap installs bird2, nftables and iputils-ping; kubectl is on every machine here"
            )
    if not (ROOT / ".venv" / "bin" / "flock-lab").exists():
        pytest.fail("the tour runs .venv/bin/flock-lab: run scripts/bootstrap first")
    # A lab of its own (unix socket paths hold at most 108 bytes: a short directory), and a kubectl cache of its own.
    directory = Path(tempfile.mkdtemp(prefix="flab-t-", dir="/run"))
    env = {**os.environ, "FLOCK_LAB_DIR": str(directory), "KUBECACHEDIR": str(directory / "kubectl-cache")}
    env.pop("KUBECONFIG", None)
    try:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-x", "-c", tour_script()],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        trace = f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr (bash -x)\n{proc.stderr[-6000:]}"
        assert proc.returncode == 0, f"the tour failed (exit {proc.returncode}); lab directory {directory}\n{trace}"
        out = proc.stdout
        # What the prose around the blocks promises.
        assert "default/web-1" in out and "shop/cart-1" in out, trace
        assert "ingress NetworkPolicy default/web-allow" in out, trace  # the matrix says what blocked a cell
        assert re.search(r"verdict\s+allowed", out), trace  # explain: shop → web-1 is allowed
    finally:
        subprocess.run(
            [sys.executable, "-m", "flock.lab.cli", "down", "--dir", str(directory)],
            capture_output=True,
            timeout=120,
            check=False,
        )
        shutil.rmtree(directory, ignore_errors=True)
