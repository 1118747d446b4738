"""Single-point AST mutations of a source file: the bugs of VT-SWE-v0's tasks (SWE-smith's kinds).

:func:`candidate_mutations` proposes mutations of every function and method
of a source file (the kinds are :data:`MUTATION_KINDS`). Each mutant is made
by editing the source *text* at the mutated node's exact span, so the rest of
the file (formatting, comments) is unchanged, and each one compiles. Which
mutants become tasks — the ones the tests catch — is decided in
:mod:`~vt_envs.domains.swe.mutants`, by running them with
:mod:`~vt_envs.domains.swe.test_runs`.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from vt_envs.errors import InvalidConfigError

__all__ = [
    "MUTATION_KINDS",
    "Mutation",
    "candidate_mutations",
    "mutation_order",
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
            found.setdefault(mutation_order(mutation), mutation)
    return [found[key] for key in sorted(found)]


def mutation_order(m: Mutation) -> tuple:
    return (m.path, m.lineno, m.col, MUTATION_KINDS.index(m.kind), m.mutated, m.function)


def _compiles(source: str, path: str) -> bool:
    # compile(), not just ast.parse(): it also rejects what only the compiler checks
    # (a ``break`` left outside its loop, ``await`` outside ``async def``).
    try:
        compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True
