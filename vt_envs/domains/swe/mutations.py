"""VT-SWE-v0's tasks, SWE-smith style: one AST mutation of a working repository, kept if caught.

SWE-smith's recipe, in four steps:

1. :func:`candidate_mutations` proposes single-point mutations of every
   function and method of a source file (the kinds are :data:`MUTATION_KINDS`).
   Each mutant is made by editing the source *text* at the mutated node's
   exact span, so the rest of the file (formatting, comments) is unchanged,
   and each one compiles.
2. :func:`run_tests` runs pytest on a repository in a subprocess under a
   deadline and reports every test's outcome by pytest node id.
3. :func:`validate` keeps a mutant only if the tests catch it: at least one
   test that passed on the clean repository stops passing (FAIL_TO_PASS) and
   at least one still passes (PASS_TO_PASS). The kept :class:`MutantTask`
   carries an issue text (:func:`issue_text`) that describes the failure
   without revealing the mutated code.
4. :func:`build_tasks` does it all for a repository, seeded; :func:`split_tasks`
   holds out whole functions, so no test task's function is ever trained on.

Every test run happens in a temporary copy of the repository: the caller's
checkout is never written to.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vt_envs.errors import InvalidConfigError

__all__ = [
    "MUTATION_KINDS",
    "MutantTask",
    "Mutation",
    "TestReport",
    "build_tasks",
    "candidate_mutations",
    "issue_text",
    "junit_node_id",
    "run_tests",
    "split_tasks",
    "validate",
]

#: The mutation kinds (SWE-smith's procedural ones), in their tie-break order.
MUTATION_KINDS = (
    "flip_comparison",
    "flip_if_else",
    "off_by_one",
    "swap_operator",
    "swap_operands",
    "remove_assignment",
    "remove_conditional",
    "remove_loop",
    "remove_return",
)

#: Not copied into a test run's working copy: caches, VCS data, virtualenvs.
_NOT_COPIED = (".git", ".hg", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache")
_NOT_COPIED += (".tox", ".nox", ".venv", "venv", "*.pyc")
_OUTPUT_TAIL_CHARS = 4000
# No cache written into the repository; the JUnit layout junit_node_id inverts; a module
# that fails to import stops no other module's tests.
_PYTEST_OPTIONS = ("-q", "-rfE", "--tb=short", "-p", "no:cacheprovider")
_PYTEST_OPTIONS += ("-o", "junit_family=xunit2", "--continue-on-collection-errors")


# --------------------------------------------------------------------------- mutations


@dataclass(frozen=True)
class Mutation:
    """One single-point change of one function.

    Attributes:
        path: the file, relative to the repository root (``/``-separated).
        function: the qualified name of the function changed (``func``, ``Class.method``,
            ``outer.inner``).
        kind: one of :data:`MUTATION_KINDS`.
        lineno, col: where the changed node starts (1-based line; UTF-8 byte column,
            as in :mod:`ast`).
        original: the source of the changed node (:func:`ast.get_source_segment`).
        mutated: what replaces it (``""`` when whole lines are deleted).
        mutant_source: the whole file after the change.
    """

    path: str
    function: str
    kind: str
    lineno: int
    col: int
    original: str
    mutated: str
    mutant_source: str = field(repr=False)

    @property
    def id(self) -> str:
        """A short hash, stable across runs and machines, of what the mutation is and where."""
        key = (self.path, self.function, self.kind, self.lineno, self.col, self.original)
        text = "\0".join(map(str, (*key, self.mutated)))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


class _Text:
    """Source text with character offsets for :mod:`ast`'s (line, UTF-8 byte column) positions."""

    _LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")  # the line breaks ast counts

    def __init__(self, text: str):
        self.text = text
        self.lines = self._LINE.findall(text)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno <= len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col].decode())

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        return self.text[self.start(node) : self.end(node)]

    def line_start(self, lineno: int) -> int:
        return self.starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        """The offset of line ``lineno``'s line break (its end, when it has none)."""
        return self.starts[lineno - 1] + len(self.lines[lineno - 1].rstrip("\r\n"))

    def starts_line(self, stmt: ast.stmt) -> bool:
        """Whether ``stmt`` (with its decorators) is the first thing on its first line."""
        if getattr(stmt, "decorator_list", None):
            return self.lines[_first_line(stmt) - 1].lstrip().startswith("@")
        return not self.text[self.line_start(stmt.lineno) : self.start(stmt)].strip()

    def owns_lines(self, stmt: ast.stmt) -> bool:
        """Whether ``stmt``'s lines hold nothing else (but a trailing comment)."""
        after = self.text[self.end(stmt) : self.line_end(stmt.end_lineno)].strip()
        return self.starts_line(stmt) and (not after or after.startswith("#"))


@dataclass(frozen=True)
class _Edit:
    """``text[start:end]`` becomes ``replacement``; ``anchor``'s source becomes ``mutated``."""

    kind: str
    anchor: ast.AST
    start: int
    end: int
    replacement: str
    mutated: str


def _expression_edit(kind: str, anchor: ast.AST, text: _Text, mutated: str) -> _Edit:
    return _Edit(kind, anchor, text.start(anchor), text.end(anchor), mutated, mutated)


def _first_line(stmt: ast.stmt) -> int:
    return min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])


def _blocks(stmt: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists nested directly in ``stmt`` (bodies, else, handlers, cases)."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for handler in getattr(stmt, "handlers", ()):
        yield handler.body
    for case in getattr(stmt, "cases", ()):
        yield case.body


def _functions(block: list[ast.stmt], prefix: str = "") -> Iterator[tuple[ast.AST, str]]:
    """Every function and method under ``block``, with its dotted qualified name."""
    for stmt in block:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield stmt, prefix + stmt.name
            yield from _functions(stmt.body, f"{prefix}{stmt.name}.")
        elif isinstance(stmt, ast.ClassDef):
            yield from _functions(stmt.body, f"{prefix}{stmt.name}.")
        else:
            for inner in _blocks(stmt):
                yield from _functions(inner, prefix)


def _statements(block: list[ast.stmt]) -> Iterator[tuple[ast.stmt, list[ast.stmt]]]:
    """Each statement of a function body with the block holding it; nested defs and classes
    are left out (they are mutated as functions of their own)."""
    for stmt in block:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield stmt, block
        for inner in _blocks(stmt):
            yield from _statements(inner)


def _expressions(node: ast.AST) -> Iterator[ast.expr]:
    """The expressions of one statement: not those of the statements nested in it, nor
    lambdas' default arguments (defaults are configuration, not behaviour)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case, ast.arguments)):
            continue
        if isinstance(child, ast.expr):
            yield child
        yield from _expressions(child)


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


# Each comparison operator's text, and the text of the one that negates it.
_COMPARISONS = {
    ast.Lt: ("<", ">="),
    ast.GtE: (">=", "<"),
    ast.LtE: ("<=", ">"),
    ast.Gt: (">", "<="),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
_NON_COMMUTATIVE += (ast.MatMult,)
# swap_operator's operators: their text, and the text of the one swapped in.
_SWAPPED = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.And: ("and", "or"), ast.Or: ("or", "and")}


def _operator_span(text: _Text, left: ast.AST, right: ast.AST) -> tuple[int, int] | None:
    """The offsets of the operator token(s) between two operands.

    Between two operands there can only be the left one's closing parentheses,
    whitespace, line continuations, comments, the operator and the right one's
    opening parentheses; what is left after removing the rest is the operator.
    """
    a, b = text.end(left), text.start(right)
    between = re.sub(r"#[^\r\n]*", lambda m: " " * len(m.group()), text.text[a:b])
    kept = [i for i, char in enumerate(between) if char not in " \t\f\r\n\\()"]
    return (a + kept[0], a + kept[-1] + 1) if kept else None


def _replace_operator(
    kind: str, node: ast.AST, operands: Sequence[ast.AST], expected: str, new: str, text: _Text
) -> _Edit | None:
    """``node`` with the operator between each pair of ``operands`` replaced by ``new``."""
    base, segment = text.start(node), text.segment(node)
    spans = [_operator_span(text, a, b) for a, b in itertools.pairwise(operands)]
    if not spans or None in spans:
        return None
    for a, b in reversed(spans):  # from the end: earlier offsets stay valid
        if " ".join(text.text[a:b].split()) != expected:
            return None  # not the token the AST says (an odd layout): propose nothing
        segment = segment[: a - base] + new + segment[b - base :]
    return _expression_edit(kind, node, text, segment)


def _swap_operands(node: ast.AST, left: ast.AST, right: ast.AST, text: _Text) -> _Edit | None:
    """``a - b`` → ``b - a``, each side keeping its own parentheses."""
    span = _operator_span(text, left, right)
    if span is None or "#" in text.text[text.end(left) : text.start(right)]:
        return None  # a comment between the operands would swallow what follows
    start, end = text.start(node), text.end(node)
    head, op, tail = (
        text.text[start : span[0]],
        text.text[span[0] : span[1]],
        text.text[span[1] : end],
    )
    left_text, right_text = head.rstrip(), tail.lstrip()
    space_before, space_after = head[len(left_text) :], tail[: len(tail) - len(right_text)]
    mutated = right_text + space_before + op + space_after + left_text
    return _expression_edit("swap_operands", node, text, mutated)


def _int_literal(node: ast.AST) -> int | None:
    """The value of an integer literal (``3``, ``-1``); ``None`` for anything else (bools too)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _int_literal(node.operand)
        return None if value is None or not isinstance(node.operand, ast.Constant) else -value
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _off_by_one_anchor(node: ast.expr, parents: Mapping[ast.AST, ast.AST]) -> ast.AST | None:
    """The expression an integer literal is mutated within, if its context is one of
    off-by-one's: a comparison, arithmetic, a slice or index, or a ``range()`` argument."""
    parent = parents.get(node)
    if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub):
        return None  # ``-1`` is mutated as one literal, at the minus
    if isinstance(parent, (ast.Compare, ast.BinOp)):
        return parent
    if isinstance(parent, ast.AugAssign) and node is parent.value:
        return parent
    if isinstance(parent, ast.Slice):
        return parents.get(parent)
    if isinstance(parent, ast.Subscript) and node is parent.slice:
        return parent
    is_range = isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
    if is_range and parent.func.id == "range" and node in parent.args:
        return parent
    return None


class _Proposer:
    """The edits of one function (see :func:`candidate_mutations` for the kinds)."""

    def __init__(self, text: _Text, parents: Mapping[ast.AST, ast.AST], function: ast.AST):
        self.text, self.parents, self.function = text, parents, function

    def edits(self) -> Iterator[_Edit]:
        body = self.function.body
        for stmt, block in _statements(body[1:] if _is_docstring(body[0]) else body):
            yield from self._statement_edits(stmt, block)
            for expr in _expressions(stmt):
                yield from self._expression_edits(expr)

    def _statement_edits(self, stmt: ast.stmt, block: list[ast.stmt]) -> Iterator[_Edit | None]:
        text = self.text
        if isinstance(stmt, (ast.Assign, ast.AugAssign)) or (
            isinstance(stmt, ast.AnnAssign) and stmt.value is not None
        ):
            yield self._removal("remove_assignment", stmt, block)
        if isinstance(stmt, ast.AugAssign) and type(stmt.op) in (ast.Add, ast.Sub):
            op, new = (f"{token}=" for token in _SWAPPED[type(stmt.op)])
            yield _replace_operator("swap_operator", stmt, [stmt.target, stmt.value], op, new, text)
        elif isinstance(stmt, ast.If):
            # An ``elif`` is the whole ``orelse`` of the ``if`` above it: deleting its
            # lines leaves a valid ``if`` without else, so it never needs a ``pass``.
            is_elif = text.text.startswith("elif", text.start(stmt))
            if not stmt.orelse:
                yield self._removal("remove_conditional", stmt, block, may_empty=is_elif)
                negated = f"not ({text.segment(stmt.test)})"
                yield _expression_edit("flip_if_else", stmt.test, text, negated)
            elif not text.text.startswith("elif", text.start(stmt.orelse[0])):
                yield self._swap_branches(stmt)
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            yield self._removal("remove_loop", stmt, block)
        elif isinstance(stmt, ast.Return) and stmt is not self.function.body[-1]:
            yield self._removal("remove_return", stmt, block)

    def _removal(
        self, kind: str, stmt: ast.stmt, block: list[ast.stmt], *, may_empty: bool = False
    ) -> _Edit:
        """Delete ``stmt``'s lines; where they hold more, or the block would be left empty,
        replace the statement with ``pass`` instead."""
        text = self.text
        if (len(block) > 1 or may_empty) and text.owns_lines(stmt):
            start = text.line_start(stmt.lineno)
            return _Edit(kind, stmt, start, text.starts[stmt.end_lineno], "", "")
        return _Edit(kind, stmt, text.start(stmt), text.end(stmt), "pass", "pass")

    def _swap_branches(self, stmt: ast.If) -> _Edit | None:
        """``if c: A else: B`` → ``if c: B else: A``, moving whole lines (each block keeps
        its own indentation, comments between the blocks stay in place)."""
        text, body, orelse = self.text, stmt.body, stmt.orelse
        if not (text.starts_line(body[0]) and text.starts_line(orelse[0])):
            return None  # ``if c: a`` on one line: no block of lines to move
        body_start, body_end = (
            text.line_start(_first_line(body[0])),
            text.line_end(body[-1].end_lineno),
        )
        else_start = text.line_start(_first_line(orelse[0]))
        start, end = text.start(stmt), text.end(stmt)
        t = text.text
        mutated = (
            t[start:body_start]
            + t[else_start:end]
            + t[body_end:else_start]
            + t[body_start:body_end]
        )
        return _expression_edit("flip_if_else", stmt, text, mutated)

    def _expression_edits(self, node: ast.expr) -> Iterator[_Edit | None]:
        text = self.text
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):  # one operator of a chain at a time
                old, new = _COMPARISONS[type(op)]
                pair = operands[i : i + 2]
                yield _replace_operator("flip_comparison", node, pair, old, new, text)
            if len(node.ops) == 1 and isinstance(node.ops[0], _ORDERING):
                yield _swap_operands(node, node.left, node.comparators[0], text)
        elif isinstance(node, ast.BinOp):
            op = type(node.op)
            if op in _SWAPPED:
                pair = [node.left, node.right]
                yield _replace_operator("swap_operator", node, pair, *_SWAPPED[op], text)
            concatenation = op is ast.Add and any(
                isinstance(side, ast.JoinedStr)
                or (isinstance(side, ast.Constant) and isinstance(side.value, str))
                for side in (node.left, node.right)
            )
            if op in _NON_COMMUTATIVE or concatenation:
                yield _swap_operands(node, node.left, node.right, text)
        elif isinstance(node, ast.BoolOp):
            old, new = _SWAPPED[type(node.op)]
            yield _replace_operator("swap_operator", node, node.values, old, new, text)
        value = _int_literal(node)
        anchor = None if value is None else _off_by_one_anchor(node, self.parents)
        if anchor is not None:
            segment, at = text.segment(anchor), text.start(node) - text.start(anchor)
            literal = text.segment(node)
            for new in (value + 1, value - 1):
                mutated = segment[:at] + str(new) + segment[at + len(literal) :]
                yield _expression_edit("off_by_one", anchor, text, mutated)


def candidate_mutations(source: str, path: str) -> list[Mutation]:
    """Every single-point mutation of the functions and methods in ``source``.

    Kinds (:data:`MUTATION_KINDS`): ``flip_comparison`` (``<``↔``>=``, ``<=``↔``>``,
    ``==``↔``!=``, ``is``↔``is not``, ``in``↔``not in``, one operator of a chain at a
    time); ``flip_if_else`` (swap the branches of an ``if`` with an ``else``; negate
    the test of one without); ``off_by_one`` (an integer literal ``n`` in a
    comparison, arithmetic, a slice or index, or a ``range()`` argument becomes
    ``n+1`` and ``n-1``); ``swap_operator`` (``+``↔``-``, ``+=``↔``-=``,
    ``and``↔``or``); ``swap_operands`` (of an ordering comparison, a
    non-commutative arithmetic operator, or a ``+`` with a string literal side);
    ``remove_assignment``, ``remove_conditional`` (an ``if`` without ``else``),
    ``remove_loop``, ``remove_return`` (not the function body's last statement):
    the statement's lines are deleted, or it becomes ``pass`` where it shares its
    lines or its block would be left empty.

    Docstrings, default arguments and decorators are never mutated. Each
    mutant edits only the node's span of the text (the rest of the file, comments
    included, is byte for byte the same), compiles, and differs from ``source``.
    Order: by line, column, kind, then mutated text.

    Raises:
        InvalidConfigError: ``source`` does not parse.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise InvalidConfigError(
            f"{path} does not parse ({error.msg}, line {error.lineno}): mutations are proposed "
            "only for valid Python source"
        ) from None
    text = _Text(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: dict[tuple, Mutation] = {}
    for function, qualname in _functions(tree.body):
        for edit in _Proposer(text, parents, function).edits():
            if edit is None:
                continue
            mutant = source[: edit.start] + edit.replacement + source[edit.end :]
            if mutant == source or not _compiles(mutant, path):
                continue
            anchor = edit.anchor
            mutation = Mutation(
                path=path,
                function=qualname,
                kind=edit.kind,
                lineno=anchor.lineno,
                col=anchor.col_offset,
                original=text.segment(anchor),
                mutated=edit.mutated,
                mutant_source=mutant,
            )
            found.setdefault(_order(mutation), mutation)
    return [found[key] for key in sorted(found)]


def _order(m: Mutation) -> tuple:
    return (m.path, m.lineno, m.col, MUTATION_KINDS.index(m.kind), m.mutated, m.function)


def _compiles(source: str, path: str) -> bool:
    # compile(), not just ast.parse(): it also rejects what only the compiler checks
    # (a ``break`` left outside its loop, ``await`` outside ``async def``).
    try:
        compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


# --------------------------------------------------------------------------- test runs


@dataclass(frozen=True)
class TestReport:
    """What one pytest run did.

    Attributes:
        passed, failed, errors: pytest node ids (``tests/test_x.py::TestK::test_y[p]``)
            by outcome; skipped tests are in none of them. A module that failed to
            import is in ``errors`` under its file's id (its tests are then in no set).
        timed_out: the run hit its deadline and was killed (the sets are then empty).
        duration_s: wall time of the run.
        output_tail: the last characters of pytest's output (stdout and stderr).
        messages: each failed or errored id's one-line-ish failure message (JUnit's
            ``message``: ``"assert 4 == 5\\n +  where 4 = f(1)"``), in execution order.
    """

    __test__ = False  # not a pytest test class, though its name says so

    passed: frozenset[str]
    failed: frozenset[str]
    errors: frozenset[str]
    timed_out: bool
    duration_s: float
    output_tail: str
    messages: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)


def run_tests(
    repo: Path,
    test_paths: Sequence[str],
    *,
    timeout_s: float,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> TestReport:
    """Run pytest on ``test_paths`` (files, directories or node ids, relative to ``repo``).

    The run happens in ``repo`` itself (callers that must keep a checkout clean
    pass a copy, as :func:`validate` does), with ``python -m pytest``, no cache
    provider, ``--rootdir=repo`` (so ids are relative to it) and a JUnit XML
    report written outside the repository, in an environment that is this
    process's minus every ``PYTHON*`` and ``PYTEST_*`` variable, plus
    ``PYTHONPATH`` = the repository root (and its ``src/``, if any: the package
    imports from the working copy), ``PYTHONDONTWRITEBYTECODE=1`` and
    ``PYTHONHASHSEED=0`` (set ordering cannot make a mutant flaky), plus ``env``
    (e.g. ``{"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}`` for a repository that needs
    no plugins: pytest then starts in a fifth of the time).

    At ``timeout_s`` the run's whole process group is killed (tests that spawn
    children included) and the report says ``timed_out``.

    Raises:
        InvalidConfigError: no test paths, a non-positive timeout, or ``python``
            cannot be started.
    """
    if not test_paths or isinstance(test_paths, str):
        raise InvalidConfigError(
            f"test_paths must be a non-empty list of test files or node ids relative to the "
            f"repository, got {test_paths!r}"
        )
    if timeout_s <= 0:
        raise InvalidConfigError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    repo = Path(repo).resolve()
    with tempfile.TemporaryDirectory(prefix="vt-swe-run-") as scratch:
        junit, log = Path(scratch) / "junit.xml", Path(scratch) / "output.txt"
        options = [f"--rootdir={repo}", f"--junitxml={junit}", *_PYTEST_OPTIONS]
        command = [python, "-m", "pytest", *options, *test_paths]
        started = time.monotonic()
        with log.open("wb") as out:
            timed_out = _run_killable(command, repo, _fresh_env(repo, env), out, timeout_s)
        duration = time.monotonic() - started
        tail = log.read_bytes()[-_OUTPUT_TAIL_CHARS:].decode("utf-8", errors="replace")
        passed, failed, errors, messages = set(), set(), set(), {}
        if not timed_out and junit.is_file():
            passed, failed, errors, messages = _read_junit(junit, repo)
    return TestReport(
        frozenset(passed), frozenset(failed), frozenset(errors), timed_out, duration, tail, messages
    )


def _fresh_env(repo: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    # This process's PATH, HOME and locale, but none of its Python or pytest settings:
    # a PYTHONPATH or PYTEST_ADDOPTS meant for the caller (say, the pytest session
    # running this) must not leak into the repository's tests.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST_"))}
    roots = [repo, *([repo / "src"] if (repo / "src").is_dir() else [])]
    env.update(
        PYTHONPATH=os.pathsep.join(map(str, roots)),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
    )
    env.update(extra or {})
    return env


def _run_killable(command: list[str], cwd: Path, env: dict, out, timeout_s: float) -> bool:
    """Run ``command`` in a new session; return whether it was killed at ``timeout_s``."""
    try:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so one killpg reaches all
        )
    except OSError as error:
        raise InvalidConfigError(
            f"cannot start {command[0]!r} ({error}); pass python= the interpreter of the "
            "repository's environment (with pytest installed)"
        ) from None
    try:
        process.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    # Also after a normal exit: a test may have left children running in the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return timed_out


def _read_junit(path: Path, repo: Path) -> tuple[set, set, set, dict]:
    passed, failed, errors, messages = set(), set(), set(), {}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return passed, failed, errors, messages  # pytest died while writing it
    for case in root.iter("testcase"):
        test_id = junit_node_id(case.get("classname", ""), case.get("name", ""), repo)
        tags = {child.tag: child for child in case}
        if "error" in tags or "failure" in tags:  # both: a failure, then an error in teardown
            (errors if "error" in tags else failed).add(test_id)
            problem = tags["failure"] if "failure" in tags else tags["error"]
            messages.setdefault(test_id, problem.get("message") or "")
        elif "skipped" not in tags:
            passed.add(test_id)
    return passed, failed, errors, messages


def junit_node_id(classname: str, name: str, repo: Path) -> str:
    """pytest's node id from a JUnit test case (the inverse of its ``mangle_test_address``).

    JUnit writes ``tests/sub/test_x.py::TestK::test_y[a.b]`` as classname
    ``tests.sub.test_x.TestK`` and name ``test_y[a.b]``; which dots were slashes
    (a directory or file name may hold dots too) is found by looking for the file.
    A module that failed to import has no classname and its dotted path as name.
    """
    parts, tail = (classname.split("."), [name]) if classname else (name.split("."), [])
    found = _find_module(repo, parts)
    path, rest = found if found else (["/".join(parts) + ".py"], [])
    return "::".join(["/".join(path), *rest, *tail])


def _find_module(base: Path, parts: list[str]) -> tuple[list[str], list[str]] | None:
    """Split dotted ``parts`` into a ``.py`` file's path under ``base`` and what follows."""
    for k in range(len(parts), 0, -1):  # the longest name first
        name = ".".join(parts[:k])
        if (base / f"{name}.py").is_file():
            return [f"{name}.py"], parts[k:]
        if (base / name).is_dir() and (found := _find_module(base / name, parts[k:])):
            return [name, *found[0]], found[1]
    return None


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class MutantTask:
    """A mutant the tests catch: the bug to fix, and the tests that judge the fix.

    Attributes:
        mutation: the bug (its ``mutant_source`` is the broken file).
        fail_to_pass: tests that pass on the clean repository and not on the mutant
            (they failed, errored, or their module no longer imports); a fix makes them pass.
        pass_to_pass: tests that pass on both; a fix must not break them.
        test_files: the test modules that judge the task (for now: the test paths given).
        issue_text: the bug report shown to the agent (see :func:`issue_text`).
    """

    mutation: Mutation
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_files: tuple[str, ...]
    issue_text: str


@contextlib.contextmanager
def _working_copy(repo: Path) -> Iterator[Path]:
    """A temporary copy of ``repo`` (without caches, VCS data and virtualenvs)."""
    with tempfile.TemporaryDirectory(prefix="vt-swe-") as scratch:
        copy = Path(scratch) / Path(repo).resolve().name
        shutil.copytree(repo, copy, symlinks=True, ignore=shutil.ignore_patterns(*_NOT_COPIED))
        yield copy


def _require_clean(baseline: TestReport) -> None:
    if baseline.timed_out:
        problem = "timed out"
    elif baseline.failed or baseline.errors:
        problem = f"had failures or errors: {sorted(baseline.failed | baseline.errors)[:10]}"
    elif not baseline.passed:
        problem = "ran no test"
    else:
        return
    raise InvalidConfigError(
        f"the baseline test run must pass every test it runs (at least one), but it {problem}. "
        "Fix the repository, or choose test_paths that pass; the run's output ends with:\n"
        f"{baseline.output_tail[-1500:]}"
    )


def validate(
    repo: Path,
    mutation: Mutation,
    test_paths: Sequence[str],
    *,
    baseline: TestReport,
    timeout_s: float,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> MutantTask | None:
    """Run ``test_paths`` on a temporary copy of ``repo`` with ``mutation`` applied.

    Returns the task if the tests catch the mutant: the run did not time out, at
    least one test of ``baseline.passed`` no longer passes (FAIL_TO_PASS) and at
    least one still does (PASS_TO_PASS); else ``None``. ``python`` and ``env`` are
    :func:`run_tests`'.

    Raises:
        InvalidConfigError: ``baseline`` did not pass every test it ran (a mutant is
            judged only against a clean repository), or ``mutation.path`` is not a
            file of ``repo``.
    """
    _require_clean(baseline)
    with _working_copy(repo) as copy:
        target = copy / mutation.path
        if not target.is_file():
            raise InvalidConfigError(
                f"mutation {mutation.id} is of {mutation.path!r}, which is not a file of {repo}"
            )
        target.write_bytes(mutation.mutant_source.encode("utf-8"))
        report = run_tests(copy, test_paths, timeout_s=timeout_s, python=python, env=env)
    if report.timed_out:
        return None  # an infinite loop is not a bug an agent can be judged on in time
    fail_to_pass = tuple(sorted(baseline.passed - report.passed))
    pass_to_pass = tuple(sorted(baseline.passed & report.passed))
    if not fail_to_pass or not pass_to_pass:
        return None
    task = MutantTask(mutation, fail_to_pass, pass_to_pass, tuple(test_paths), issue_text="")
    return dataclasses.replace(task, issue_text=issue_text(task, report))


def _source_files(repo: Path, source_paths: Sequence[str]) -> list[str]:
    """The ``.py`` files named by ``source_paths`` (files or directories), sorted."""
    if not source_paths or isinstance(source_paths, str):
        raise InvalidConfigError(
            f"source_paths must be a non-empty list of files or directories relative to the "
            f"repository, got {source_paths!r}"
        )
    files = set()
    for rel in source_paths:
        path = repo / rel
        if path.is_file():
            files.add(path.relative_to(repo).as_posix())
        elif path.is_dir():
            skipped = {n for n in _NOT_COPIED if not n.startswith("*")}
            for found in path.rglob("*.py"):
                if not skipped & set(found.relative_to(repo).parts):
                    files.add(found.relative_to(repo).as_posix())
        else:
            raise InvalidConfigError(f"source path {rel!r} is not a file or directory of {repo}")
    return sorted(files)  # sorted: the shuffle must not depend on the filesystem's order


def build_tasks(
    repo: Path,
    *,
    source_paths: Sequence[str],
    test_paths: Sequence[str],
    seed: int,
    max_tasks: int | None = None,
    timeout_s: float,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> list[MutantTask]:
    """The mutants of ``source_paths`` that ``test_paths`` catch, at most ``max_tasks``.

    Runs the tests once on a clean copy (the baseline), proposes
    :func:`candidate_mutations` for every ``.py`` file of ``source_paths`` (files
    or directories, relative to ``repo``), shuffles them with
    ``random.Random(seed)`` and :func:`validate`\\ s them in that order until
    ``max_tasks`` are kept (``None``: all). A candidate whose file text equals the
    original, or one already tried, is skipped without a run (a duplicate of a
    rejected mutant would be rejected too). The same repository, arguments and
    seed give the same tasks, returned sorted by file, line, column and kind.

    Raises:
        InvalidConfigError: bad arguments, a source file that does not parse, or a
            baseline that does not pass every test it runs.
    """
    repo = Path(repo).resolve()
    if max_tasks is not None and max_tasks < 1:
        raise InvalidConfigError(f"max_tasks must be >= 1 or None (all), got {max_tasks!r}")
    files = _source_files(repo, source_paths)
    options = {"timeout_s": timeout_s, "python": python, "env": env}
    with _working_copy(repo) as copy:
        baseline = run_tests(copy, test_paths, **options)
    _require_clean(baseline)
    originals, candidates = {}, []
    for rel in files:
        try:
            originals[rel] = (repo / rel).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidConfigError(f"source file {rel!r} is not UTF-8 text") from None
        candidates.extend(candidate_mutations(originals[rel], rel))
    random.Random(seed).shuffle(candidates)
    tried, kept = set(), []
    for mutation in candidates:
        if max_tasks is not None and len(kept) >= max_tasks:
            break
        key = (mutation.path, mutation.mutant_source)
        if key in tried or mutation.mutant_source == originals[mutation.path]:
            continue
        tried.add(key)
        task = validate(repo, mutation, test_paths, baseline=baseline, **options)
        if task is not None:
            kept.append(task)
    return sorted(kept, key=lambda task: _order(task.mutation))


def split_tasks(
    tasks: Sequence[MutantTask], test_fraction: float = 0.2, *, seed: int
) -> tuple[list[MutantTask], list[MutantTask]]:
    """``(train, test)``: about ``test_fraction`` of the mutated *functions* are held out,
    with all their mutants, so no test task's function is ever trained on.

    The fraction counts functions, not tasks. With two or more functions and a
    fraction above 0, each split gets at least one. Deterministic given ``seed``;
    each split keeps the order of ``tasks``.

    Raises:
        InvalidConfigError: ``test_fraction`` is not in ``[0, 1)``.
    """
    if not 0 <= test_fraction < 1:
        raise InvalidConfigError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    functions = sorted({(t.mutation.path, t.mutation.function) for t in tasks})
    random.Random(seed).shuffle(functions)
    n_test = round(len(functions) * test_fraction)
    if test_fraction > 0 and len(functions) > 1:
        n_test = min(max(n_test, 1), len(functions) - 1)
    held_out = set(functions[:n_test])
    train = [t for t in tasks if (t.mutation.path, t.mutation.function) not in held_out]
    test = [t for t in tasks if (t.mutation.path, t.mutation.function) in held_out]
    return train, test


# --------------------------------------------------------------------------- issue text

_ASSERT_EQUAL = re.compile(r"^(?:AssertionError: )?assert (?P<got>.+?) == (?P<want>.+)$")
_WHERE = re.compile(r"^\+\s*where (?P<got>.+?) = (?P<call>.+)$")
_METHOD_OF = re.compile(r"^<(?:[\w.]*\.)?(\w+) object>\.(\w+)$")  # "<pkg.mod.Tally object>.add"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # in default reprs: differs from run to run
_MAX_QUOTED_LINES, _MAX_LINE_CHARS = 6, 200


def _forbidden(mutation: Mutation) -> list[re.Pattern]:
    """What an issue text must not contain: any line of the original or mutated code,
    and the mutation's file and line together."""
    lines = {
        line.strip() for code in (mutation.original, mutation.mutated) for line in code.splitlines()
    }
    patterns = [
        # A bare word (``pass``, a variable) is matched as a word, not inside others.
        re.compile(rf"\b{re.escape(line)}\b" if re.fullmatch(r"\w+", line) else re.escape(line))
        for line in sorted(lines)
        if line
    ]
    where = re.escape(mutation.path) + rf"(?::|\"?, line ){mutation.lineno}\b"
    return [*patterns, re.compile(where), re.compile(rf"\bline {mutation.lineno}\b")]


def _leaks(text: str, forbidden: Sequence[re.Pattern]) -> bool:
    return any(pattern.search(text) for pattern in forbidden)


def _package_of(path: str) -> str:
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 1:
        parts = parts[1:]
    return parts[0].removesuffix(".py")


def _failure_lines(task: MutantTask, report: TestReport) -> tuple[str | None, list[str]]:
    """The first failing FAIL_TO_PASS test (in execution order) and its message's lines."""
    failing = set(task.fail_to_pass)
    first = next((t for t, m in report.messages.items() if t in failing and m), None)
    if first is None:  # no message (or the module failed to import): any message, or E lines
        first = next((t for t, m in report.messages.items() if m), None)
    if first is not None:
        message = report.messages[first]
    else:
        message = "\n".join(
            line[1:].strip() for line in report.output_tail.splitlines() if line.startswith("E ")
        )
    message = _ADDRESS.sub("", message)
    lines = [line.rstrip()[:_MAX_LINE_CHARS] for line in message.splitlines() if line.strip()]
    return (first if first in failing else None), lines[:_MAX_QUOTED_LINES]


def _calling_sentence(lines: Sequence[str]) -> str | None:
    """``"Calling `f(1)` returns 4, but 5 is expected."`` from an ``assert 4 == 5`` message
    (``Tally.add(...)`` where pytest's explanation says ``add`` is a ``Tally``'s method)."""
    match = _ASSERT_EQUAL.match(lines[0].strip()) if lines else None
    if match is None:
        return None
    got, want = match.group("got"), match.group("want")
    wheres = [w for w in (_WHERE.match(line.strip()) for line in lines[1:]) if w]
    call = next((w.group("call") for w in wheres if w.group("got") == got), None)
    if call is None:
        return None
    for where in wheres:
        method = _METHOD_OF.match(where.group("call"))
        if method and where.group("got") == method.group(2) and call.startswith(f"{method[2]}("):
            call = f"{method.group(1)}.{call}"
            break
    return f"Calling `{call}` returns {got}, but {want} is expected."


def issue_text(task: MutantTask, report: TestReport) -> str:
    """A bug report for ``task`` from the mutant's test run ``report``.

    It names the package, states the wrong behaviour by quoting the first
    failing test's failure message (as "Calling `f(x)` returns X, but Y is
    expected." where the assertion says so), and lists the failing tests by id.
    It never contains a line of ``task.mutation.original`` or ``.mutated``, nor
    the mutation's file with its line number: any sentence, quoted line or test
    id that would is left out.
    """
    forbidden = _forbidden(task.mutation)
    package = f"`{_package_of(task.mutation.path)}`"
    if _leaks(package, forbidden):
        package = "the package"
    first, lines = _failure_lines(task, report)
    lines = [line for line in lines if not _leaks(line, forbidden)]
    parts = [f"Bug report: {package} misbehaves."]
    sentence = _calling_sentence(lines)
    if sentence and not _leaks(sentence, forbidden):
        parts.append(sentence)
    if lines:
        shown = first is not None and not _leaks(first, forbidden)
        who = f"The first failing test, {first}," if shown else "The first failure"
        parts.append(f"{who} reports:\n" + "\n".join(f"    {line}" for line in lines))
    names = [t for t in task.fail_to_pass if not _leaks(t, forbidden)]
    if names:
        parts.append("Tests that fail:\n" + "\n".join(f"- {name}" for name in names))
    parts.append(
        f"Fix {package} so that the failing tests succeed, without breaking the "
        f"{len(task.pass_to_pass)} other tests, which succeed now."
    )
    text = "\n\n".join(parts)
    # A last guard, for a leak no single part showed (one spanning two parts).
    return text if not _leaks(text, forbidden) else parts[0]
