"""VT-Multi-v0's task families: each needs two different tools in one episode.

- ``sql_lcm`` (SQL, then Python): *What is the least common multiple of the
  unit prices, in cents, of all items ordered by customer 43?* (or of the
  Books items ordered in March 2023). The prices are only in the ``shop``
  database; their LCM (8-40 prices: dozens of digits) overflows DuckDB's
  128-bit integers, so SQL alone cannot finish it.
- ``sql_product`` (SQL, then Python): *the exact product of the line totals
  (quantity times unit price, in cents) of the Books items ordered in March
  2023* (or of a customer's items) — 8-40 factors, dozens to hundreds of
  digits: exact only with Python's integers (DuckDB's is a float).
- ``search_days`` (search, then Python): two sentences of the Wikipedia
  summaries with a year blanked out (VT-Search-v0's ``year_cloze`` tasks,
  each retrievable by its sentence); *how many days are there from 1 January
  of the earlier year to 1 January of the later one?* The years are only in
  the corpus; the calendar arithmetic (leap years) is Python's.
- ``crop_product`` (crop/zoom, then Python): a large cluttered scene (VT-Visual-v0's
  canvas) with two small tags, each showing a 3-digit number in 9-12 px
  type; *what is the product of the two numbers?* Reading them takes a zoom
  (for a vision-language policy); the 5-6 digit product, Python.

Golds are computed at generation (the SQL families read the database
read-only); ``assets`` hold the privileged facts the oracle uses (the
query, the years) next to what the tools need (``db_path``). Splits: a
customer (or a month of a category) is held out iff the SHA-256 of its key
falls in one bucket of eight; a search pair takes both sentences from
VT-Search-v0's own split (held-out articles), so no test fact is a training
fact. No task repeats: each family draws its customers, category-months and
sentence pairs without replacement (a seeded order), and the source
interleaves the families, each capped at an equal share of the size
(balanced: the test split holds 66, 66, 75, 75 of 282). Lookup by id builds
only that task (:class:`MultiTasks`).
"""

from __future__ import annotations

import datetime
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from vt_envs.core.task import SPLITS, GeneratedTasks, Task, TaskSource
from vt_envs.errors import InvalidConfigError

__all__ = ["FAMILIES", "MultiTasks", "images_of_task", "multi_tasks", "number_scene"]

FAMILIES = ("sql_lcm", "sql_product", "search_days", "crop_product")
_TEST_BUCKETS = 8


def _is_test(key: str) -> bool:
    return hashlib.sha256(key.encode()).digest()[0] % _TEST_BUCKETS == 0


def _in_split(key: str, split: str) -> bool:
    return _is_test(key) == (split == "test")


@lru_cache(maxsize=4)
def _shop_facts(db_path: str) -> dict[str, Any]:
    """What the SQL families draw from, read once from the database (read-only)."""
    from vt_envs.domains.sql.databases import connect_readonly

    con = connect_readonly(db_path)
    try:
        items = con.execute(
            "SELECT o.customer_id, p.category, strftime(o.order_date, '%Y-%m'), i.quantity, "
            "CAST(round(i.unit_price * 100) AS BIGINT) FROM order_items i "
            "JOIN orders o USING (order_id) JOIN products p USING (product_id) "
            "ORDER BY i.order_id, i.product_id"
        ).fetchall()
    finally:
        con.close()
    # Each SQL family groups the items two ways (by customer, by category-month), so
    # that it has as many held-out groups as the other families have test tasks.
    groups: dict[str, dict[Any, list[int]]] = {
        "customer_prices": {},
        "customer_totals": {},
        "month_prices": {},
        "month_totals": {},
    }
    for customer, category, month, quantity, cents in items:
        month_key, total = (str(category), str(month)), int(quantity) * int(cents)
        groups["customer_prices"].setdefault(int(customer), []).append(int(cents))
        groups["customer_totals"].setdefault(int(customer), []).append(total)
        groups["month_prices"].setdefault(month_key, []).append(int(cents))
        groups["month_totals"].setdefault(month_key, []).append(total)
    # 8 values at least (an LCM or product SQL cannot finish), 40 at most (the SQL tool
    # shows 50 rows: the agent sees every value)
    return {
        name: {k: v for k, v in group.items() if 8 <= len(v) <= 40}
        for name, group in groups.items()
    }


def _pool(keys: Sequence[Any], split: str, key: Callable[[Any], str], seed: int) -> list[Any]:
    """``split``'s keys in a seeded order (drawn without replacement)."""
    mine = sorted(k for k in keys if _in_split(key(k), split))
    order = np.random.default_rng([seed, split == "test"]).permutation(len(mine))
    return [mine[int(i)] for i in order]


def _group_words(group: tuple[str, Any]) -> tuple[str, str, str]:
    """``(id key, the items in words, the SQL filter)`` of a customer or a category-month."""
    kind, key = group
    if kind == "customer":
        return f"c{key}", f"all the items ordered by customer {key}", f"o.customer_id = {key}"
    category, month = key
    year, mon = (int(x) for x in month.split("-"))
    when = datetime.date(year, mon, 1).strftime("%B %Y")
    return (
        f"{category}-{month}",
        f"every item of a {category} product in the orders placed in {when}",
        f"p.category = '{category}' AND strftime(o.order_date, '%Y-%m') = '{month}'",
    )


_FROM = "FROM order_items i JOIN orders o USING (order_id) JOIN products p USING (product_id) "


def _sql_lcm(db_path: str, split: str, group: tuple[str, Any]) -> Task:
    facts = _shop_facts(db_path)[f"{group[0]}_prices"][group[1]]
    key, items, where = _group_words(group)
    prompt = (
        "In the shop database, what is the least common multiple of the unit prices, in "
        f"cents, of {items}? (A unit price of $12.34 is 1234 cents.) Give the exact integer."
    )
    return _task(
        "sql_lcm",
        split,
        key,
        prompt,
        str(math.lcm(*facts)),
        db_path,
        query=f"SELECT i.unit_price {_FROM}WHERE {where}",
        code="import math\nprint(math.lcm(*[round(p * 100) for p in VALUES]))",
        needs=("sql", "python"),
    )


def _sql_product(db_path: str, split: str, group: tuple[str, Any]) -> Task:
    facts = _shop_facts(db_path)[f"{group[0]}_totals"][group[1]]
    key, items, where = _group_words(group)
    prompt = (
        f"In the shop database, take {items}, and its line total: quantity times unit "
        "price, in cents. What is the exact product of all these line totals?"
    )
    return _task(
        "sql_product",
        split,
        key,
        prompt,
        str(math.prod(facts)),
        db_path,
        query=f"SELECT i.quantity * i.unit_price {_FROM}WHERE {where}",
        code="import math\nprint(math.prod(round(t * 100) for t in VALUES))",
        needs=("sql", "python"),
    )


def _split_key(group: tuple[str, Any]) -> str:
    """What decides a group's split: a customer, or a category-month (as before issue 31)."""
    kind, key = group
    return f"customer/{key}" if kind == "customer" else f"sales/{key}"


def _year_facts(search_tasks: TaskSource) -> list[Task]:
    """The ``year_cloze`` tasks whose year is a plain year AD (1..9999)."""
    facts = []
    for i in range(len(search_tasks)):
        task = search_tasks[i]
        gold = _gold(task)
        if task.metadata.get("kind") == "year_cloze" and gold.isdigit() and 1 <= int(gold) <= 9999:
            facts.append(task)
    return facts


def _year_pairs(facts: Sequence[Task], split: str, count: int) -> list[tuple[Task, Task]]:
    """``count`` distinct pairs of sentences with different years, in a seeded order."""
    rng = np.random.default_rng([9, split == "test"])
    pairs: list[tuple[Task, Task]] = []
    seen: set[tuple[int, int]] = set()
    limit = len(facts) * (len(facts) - 1) // 2
    while len(pairs) < count and len(seen) < limit:
        i, j = sorted(int(x) for x in rng.choice(len(facts), size=2, replace=False))
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if _gold(facts[i]) != _gold(facts[j]):
            pairs.append((facts[i], facts[j]))
    return pairs


def _search_days(db_path: str, split: str, pair: tuple[Task, Task], k: int) -> Task:
    a, b = pair
    years = [int(_gold(a)), int(_gold(b))]
    first, second = (_sentence(t) for t in (a, b))
    lo, hi = sorted(years)
    days = (datetime.date(hi, 1, 1) - datetime.date(lo, 1, 1)).days
    prompt = (
        "Each of these two sentences from the knowledge base (Wikipedia summaries) has a year "
        f"replaced by ____:\n1. {first}\n2. {second}\nHow many days are there from 1 January "
        "of the earlier of the two years to 1 January of the later one (Gregorian calendar)?"
    )
    return _task(
        "search_days",
        split,
        k,
        prompt,
        str(days),
        db_path,
        queries=[a.assets["oracle_queries"][0], b.assets["oracle_queries"][0]],
        gold_titles=[a.assets["gold_titles"][0], b.assets["gold_titles"][0]],
        years=years,
        code=(
            "from datetime import date\nlo, hi = sorted(YEARS)\n"
            "print((date(hi, 1, 1) - date(lo, 1, 1)).days)"
        ),
        needs=("search", "python"),
    )


@lru_cache(maxsize=32)
def number_scene(seed: int) -> tuple[np.ndarray, tuple[int, int], tuple[tuple[int, ...], ...]]:
    """The ``crop_product`` scene of ``seed``: ``(image, the two numbers, their boxes)``."""
    from vt_envs.domains.visual.ops import as_image_array
    from vt_envs.domains.visual.scenes import cluttered_canvas, free_spot, scene_font

    rng = np.random.default_rng([10, seed])
    image, draw = cluttered_canvas(rng)
    width, height = image.size
    numbers = tuple(int(n) for n in rng.integers(100, 1000, size=2))
    boxes, taken = [], []
    for number in numbers:
        font = scene_font(int(rng.integers(9, 13)))
        left, top, right, bottom = draw.textbbox((0, 0), str(number), font=font)
        box = free_spot(
            rng, (right - left + 8, bottom - top + 8), (16, 16, width - 16, height - 16), taken
        )
        draw.rectangle(
            (box[0], box[1], box[2] - 1, box[3] - 1), fill=(255, 255, 255), outline=(0, 0, 0)
        )
        draw.text((box[0] + 4 - left, box[1] + 4 - top), str(number), fill=(0, 0, 0), font=font)
        boxes.append(box)
    return as_image_array(image), numbers, tuple(boxes)


def _crop_product(db_path: str, split: str, k: int) -> Task:
    seed = 2 * k + (split == "test")  # the splits' scenes never coincide
    image, (a, b), boxes = number_scene(seed)
    height, width = image.shape[:2]
    prompt = (
        f"<image>\n(Image 0: {width}x{height} pixels.)\nTwo small white tags with a black "
        "border each show a 3-digit number. What is the product of the two numbers?"
    )
    return _task(
        "crop_product",
        split,
        k,
        prompt,
        str(a * b),
        db_path,
        targets=[list(box) for box in boxes],
        numbers=[a, b],
        code="print(A * B)",
        needs=("zoom", "python"),
        extra={"number_scene": seed, "image_size": [width, height]},
    )


def images_of_task(task: Task) -> tuple[np.ndarray, ...]:
    """A VT-Multi task's images: its scene for ``crop_product``, none for the others."""
    seed = task.assets.get("number_scene") if task.assets else None
    return () if seed is None else (number_scene(int(seed))[0],)


def _gold(task: Task) -> str:
    return str(task.gold[0] if isinstance(task.gold, (list, tuple)) else task.gold)


def _sentence(task: Task) -> str:
    """``"Title": the blanked sentence`` of a year_cloze task (from its oracle query)."""
    title, _, sentence = task.assets["oracle_queries"][0].partition(": ")
    return f'(from "{title}") {sentence}'


def _task(
    family: str,
    split: str,
    k: int | str,
    prompt: str,
    gold: str,
    db_path: str,
    *,
    needs: tuple[str, str],
    extra: dict[str, Any] | None = None,
    **oracle: Any,
) -> Task:
    return Task(
        id=f"multi/{split}/{family}/{k}",
        prompt=prompt,
        gold=gold,
        metadata={"family": family, "tools": list(needs)},
        assets={"db_path": db_path, "db_id": "shop", "oracle": oracle, **(extra or {})},
    )


class MultiTasks(GeneratedTasks):
    """VT-Multi-v0's source: tasks built on demand, and looked up by id without
    building any other (an id names its family and its draw)."""

    def __init__(self, generate: Callable[[str, int], Task], ids: Sequence[str], *, split: str):
        super().__init__(generate, len(ids), name="multi", split=split)
        self._id_index = {task_id: index for index, task_id in enumerate(ids)}

    def find(self, task_id: str, *, scan: bool = True) -> Task | None:
        index = self._id_index.get(task_id)
        return None if index is None else self[index]

    def ids(self) -> list[str]:
        """Every task's id, in index order, without building a task."""
        return list(self._id_index)


def _interleave(pools: Mapping[str, Sequence[Any]], names: Sequence[str], wanted: int) -> list:
    """``(family, k)`` in turns, each family capped at an equal share of ``wanted``."""
    share = -(-wanted // len(names))
    order: list[tuple[str, int]] = []
    for turn in range(share):
        order.extend((f, turn) for f in names if turn < len(pools[f]))
    return order[:wanted]


def multi_tasks(
    split: str = "train",
    *,
    search_tasks: TaskSource | None,
    db_path: str,
    families: Sequence[str] = FAMILIES,
    size: int | None = None,
) -> MultiTasks:
    """The seeded task source of VT-Multi-v0 (train: 3,000 tasks at most; test: 300).

    The families take turns (index 0 is the first family's first task, index
    1 the second family's, ...), each capped at an equal share of the size, so
    no family outnumbers another; a family whose groups or sentence pairs run
    out drops out of the rotation (the source is then smaller). ``search_tasks``
    is VT-Search-v0's source of the same split (its year sentences);
    ``db_path`` the ``shop`` database.
    """
    if split not in SPLITS:
        raise InvalidConfigError(f"split must be one of {SPLITS}, got {split!r}")
    names = [families] if isinstance(families, str) else list(families)
    unknown = [f for f in names if f not in FAMILIES]
    if unknown or not names:
        raise InvalidConfigError(f"families must be a non-empty list of {FAMILIES}, got {names}")
    wanted = size or (3000 if split == "train" else 300)
    pools = _pools(split, names, search_tasks, db_path, wanted)
    order = _interleave(pools, names, wanted)
    builders: dict[str, Callable[[str, int], Task]] = {
        "sql_lcm": lambda s, k: _sql_lcm(db_path, s, pools["sql_lcm"][k]),
        "sql_product": lambda s, k: _sql_product(db_path, s, pools["sql_product"][k]),
        "search_days": lambda s, k: _search_days(db_path, s, pools["search_days"][k], k),
        "crop_product": lambda s, k: _crop_product(db_path, s, k),
    }

    def task_id(family: str, k: int) -> str:
        key = _group_words(pools[family][k])[0] if family.startswith("sql") else k
        return f"multi/{split}/{family}/{key}"

    def generate(split: str, index: int) -> Task:
        family, k = order[index]
        return builders[family](split, k)

    return MultiTasks(generate, [task_id(f, k) for f, k in order], split=split)


def _pools(
    split: str, names: Sequence[str], search_tasks: TaskSource | None, db_path: str, wanted: int
) -> dict[str, Sequence[Any]]:
    """What each family draws from, in ``split``'s seeded order."""
    shop = _shop_facts(db_path) if {"sql_lcm", "sql_product"} & set(names) else {}
    pools: dict[str, Sequence[Any]] = {}
    for family, seed, value in (("sql_lcm", 11, "prices"), ("sql_product", 12, "totals")):
        if family in names:
            groups = [("customer", c) for c in shop[f"customer_{value}"]]
            groups += [("month", k) for k in shop[f"month_{value}"]]
            pools[family] = _pool(groups, split, _split_key, seed)
    if "search_days" in names:
        facts = _year_facts(search_tasks) if search_tasks is not None else []
        if len(facts) < 2:
            raise InvalidConfigError(
                f"VT-Search-v0's {split} split has {len(facts)} year sentences; search_days "
                "needs at least 2"
            )
        pools["search_days"] = _year_pairs(facts, split, wanted)
    if "crop_product" in names:
        pools["crop_product"] = range(wanted)
    return pools
