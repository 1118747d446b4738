"""SQLite gold queries (Spider, BIRD) rewritten for DuckDB with their meaning kept.

:func:`sqlite_to_duckdb` parses a query with ``sqlglot`` (``read="sqlite"``)
and writes it for DuckDB, after fixing what ``sqlglot`` alone does not:

- ``LIKE`` is case-insensitive (for ASCII) in SQLite and case-sensitive in
  DuckDB: it becomes ``ILIKE`` (``GLOB`` stays case-sensitive in both);
- ``int / int`` truncates in SQLite and is a float in DuckDB: a division
  whose operands are both integer-typed (types from the DuckDB copy's
  columns) becomes ``//`` (which also truncates toward zero), with a zero
  divisor giving NULL as in SQLite. ``sqlglot`` alone writes
  ``CAST(a / b AS BIGINT)``, which *rounds* in DuckDB (7/2 gives 4);
- a double-quoted name that is no column, table or alias of the database or
  query is a string literal in SQLite (``country = "France"``): it becomes
  ``'France'``;
- a bare column in an aggregate query (``SELECT name, MAX(age) FROM t``,
  ``... GROUP BY country`` selecting ``name``) takes its value from the row
  holding the query's one ``MAX``/``MIN`` in SQLite: it becomes
  ``arg_max(name, age)`` / ``arg_min``; with no such aggregate SQLite picks
  an arbitrary row, and it becomes ``any_value`` (``bare="min"``/``"max"``
  give the two extreme choices, so a caller can check the pick does not
  matter).

Nothing here proves a rewrite right: the loader
(:func:`~vt_envs.domains.sql.spider.load_spider`) runs each gold on SQLite
and its rewrite on DuckDB over the same rows and refuses the golds whose
results differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.schema import MappingSchema

__all__ = ["BARE_CHOICES", "TranspileError", "Transpiled", "sqlite_to_duckdb"]

#: How a bare column without one MAX/MIN is rewritten: ``any_value``, ``min`` or ``max``.
BARE_CHOICES = ("any_value", "min", "max")

Schema = Mapping[str, Mapping[str, str]]  # {table: {column: DuckDB type}}


class TranspileError(ValueError):
    """Raised when a SQLite query cannot be parsed or rewritten for DuckDB."""


@dataclass(frozen=True)
class Transpiled:
    """A query rewritten for DuckDB and the rewrites it needed.

    ``rewrites`` names each kind once: ``"ilike"``, ``"int_division"``,
    ``"string_literal"``, ``"bare_column"`` (arg_max/arg_min),
    ``"bare_column_any"`` (no MAX/MIN picks the row: see ``bare``).
    """

    sql: str
    rewrites: tuple[str, ...]


def sqlite_to_duckdb(sql: str, schema: Schema, *, bare: str = "any_value") -> Transpiled:
    """Rewrite SQLite ``sql`` for DuckDB over tables typed as in ``schema``.

    Raises:
        TranspileError: the query does not parse as one SQLite statement.
    """
    if bare not in BARE_CHOICES:
        raise ValueError(f"bare must be one of {BARE_CHOICES}, got {bare!r}")
    try:
        trees = sqlglot.parse(sql.strip().rstrip(";"), read="sqlite")
    except SqlglotError as error:
        raise TranspileError(f"sqlglot cannot parse it as SQLite: {error}") from error
    if len(trees) != 1 or trees[0] is None:
        raise TranspileError(f"expected one statement, got {len(trees)}")
    tree, rewrites = trees[0], []
    if _string_literals(tree, schema):
        rewrites.append("string_literal")
    if _ilike(tree):
        rewrites.append("ilike")
    if _integer_division(tree, schema):
        rewrites.append("int_division")
    for kind in _bare_columns(tree, bare):
        if kind not in rewrites:
            rewrites.append(kind)
    try:
        text = tree.sql(dialect="duckdb")
    except SqlglotError as error:
        raise TranspileError(f"sqlglot cannot write it for DuckDB: {error}") from error
    return Transpiled(text, tuple(rewrites))


def _string_literals(tree: exp.Expression, schema: Schema) -> bool:
    names = {t.lower() for t in schema} | {c.lower() for cols in schema.values() for c in cols}
    names |= {a.alias_or_name.lower() for a in tree.find_all(exp.Alias, exp.TableAlias)}
    names |= {t.alias_or_name.lower() for t in tree.find_all(exp.Table, exp.CTE)}
    changed = False
    for column in list(tree.find_all(exp.Column)):
        ident = column.this
        if (
            isinstance(ident, exp.Identifier)
            and ident.quoted
            and not column.table
            and ident.name.lower() not in names
        ):
            column.replace(exp.Literal.string(ident.name))
            changed = True
    return changed


def _ilike(tree: exp.Expression) -> bool:
    likes = list(tree.find_all(exp.Like))
    for like in likes:
        like.replace(exp.ILike(this=like.this, expression=like.expression))
    return bool(likes)


_INTEGER_TYPES = exp.DataType.INTEGER_TYPES


def _integer_division(tree: exp.Expression, schema: Schema) -> bool:
    """Make ``int / int`` a truncating ``//``: the types come from an annotated copy,
    whose divisions pair with the tree's in walk order."""
    divisions = list(tree.find_all(exp.Div))
    if not divisions:
        return False
    try:
        mapping = MappingSchema({t: dict(c) for t, c in schema.items()}, dialect="sqlite")
        typed = qualify(
            tree.copy(),
            schema=mapping,
            dialect="sqlite",
            validate_qualify_columns=False,
            expand_stars=False,
            identify=False,
        )
        annotate_types(typed, schema=mapping, dialect="sqlite")
    except SqlglotError:
        return False  # types unknown: left as is (the execution check decides)
    typed_divisions = list(typed.find_all(exp.Div))
    if len(typed_divisions) != len(divisions):
        return False
    changed = False
    for node, twin in zip(divisions, typed_divisions):
        left, right = twin.this.type, twin.expression.type
        if _integer(left) and _integer(right):
            zero = exp.Literal.number(0)
            divisor = exp.Nullif(this=node.expression.copy(), expression=zero)
            node.replace(exp.paren(exp.IntDiv(this=node.this.copy(), expression=divisor)))
            changed = True
    return changed


def _integer(kind: exp.DataType | None) -> bool:
    return kind is not None and kind.this in _INTEGER_TYPES


def _aggregates(node: exp.Expression) -> list[exp.AggFunc]:
    return [a for a in node.find_all(exp.AggFunc) if not _in_subquery(a, node)]


def _in_subquery(node: exp.Expression, root: exp.Expression) -> bool:
    if node is root:
        return False
    parent = node.parent
    while parent is not None and parent is not root:
        if isinstance(parent, (exp.Subquery, exp.Select)):
            return True
        parent = parent.parent
    return False


def _bare_columns(tree: exp.Expression, bare: str) -> list[str]:
    kinds = []
    for select in list(tree.find_all(exp.Select)):
        group = select.args.get("group")
        grouped = [g for g in (group.expressions if group else [])]
        projections = select.expressions
        if not grouped and not any(_aggregates(p) for p in projections):
            continue
        if any(p.find(exp.Window) for p in projections):
            continue
        keys = {g.sql().lower() for g in grouped} | {
            g.name.lower() for g in grouped if isinstance(g, exp.Column)
        }
        aliases = {p.alias.lower() for p in projections if p.alias}
        extremes = [
            a for p in projections for a in _aggregates(p) if isinstance(a, (exp.Max, exp.Min))
        ]
        targets = list(projections)
        order = select.args.get("order")
        if order is not None:
            targets += [o.this for o in order.expressions]
        for target in targets:
            node = target.this if isinstance(target, exp.Alias) else target
            if _aggregates(node) or not list(node.find_all(exp.Column)):
                continue
            if node.sql().lower() in keys or (
                isinstance(node, exp.Column) and node.name.lower() in keys | aliases
            ):
                continue
            if len(extremes) == 1:
                fn = "ARG_MAX" if isinstance(extremes[0], exp.Max) else "ARG_MIN"
                arg = extremes[0].this.copy()
                wrapped = exp.Anonymous(this=fn, expressions=[node.copy(), arg])
                kinds.append("bare_column")
            else:
                fn = {"any_value": "ANY_VALUE", "min": "MIN", "max": "MAX"}[bare]
                wrapped = exp.Anonymous(this=fn, expressions=[node.copy()])
                kinds.append("bare_column_any")
            if isinstance(node, exp.Column) and target is node and target.parent is select:
                wrapped = exp.alias_(wrapped, node.name)
            node.replace(wrapped)
    return kinds
