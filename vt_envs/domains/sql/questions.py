"""Templated questions with gold SQL over the embedded databases, each checked by execution.

A :class:`Template` pairs a question with its gold SQL; its parameters are
drawn with a seeded RNG from *pools* of values read from the database
(airport codes, market segments, ...). A drawn question is kept only if its
gold SQL passes :func:`check_gold`: it runs, returns the same non-empty
result twice, and the result is not already written in the question.

Difficulty grows with the SQL needed: ``easy`` (one table, filters,
aggregates), ``medium`` (joins, GROUP BY / HAVING, ORDER BY ... LIMIT),
``hard`` (nested queries, EXISTS, self-joins, window functions).

Splits are disjoint by construction, and the test split holds out whole
kinds of question, not only constants: a template marked ``held_out`` is
never drawn for train (its questions appear only in test), and a question of
any other template belongs to the test split exactly when a hash of its gold
SQL falls in the held-out bucket (one in five), so no train draw can produce
a test question. Each draw picks its template uniformly among those its
split may use, so every template (held-out ones included) has the same share
of the test split. The test split of each database is deduplicated; task
``k`` of a split is the same on every machine as long as this module and the
database are unchanged (ids ``sql/<db>/<split>/<k>``).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from random import Random
from typing import Any

import duckdb

from vt_envs.domains.sql.databases import connect_readonly
from vt_envs.domains.sql.execution import execute_query
from vt_envs.domains.sql.results import format_value, has_top_level_order_by, results_match

__all__ = ["POOLS", "TEMPLATES", "GeneratedQuestion", "QuestionBank", "Template", "check_gold"]

DIFFICULTIES = ("easy", "medium", "hard")
_TEST_BUCKETS = 5  # one bucket in five is held out
_MAX_ATTEMPTS = 2000
_PARAM_TRIES = 25  # parameter draws per template draw until the split's hash bucket is hit
_MONTHS = (  # noqa: SIM905
    "January February March April May June July August September October November December"
).split()


def sql_str(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


def _pick(rng: Random, items: Sequence) -> Any:
    # random() is the one RNG output Python keeps stable across versions.
    return items[int(rng.random() * len(items))]


@dataclass(frozen=True)
class Template:
    """One kind of question.

    Attributes:
        id: ``"<db>/<name>"``, stored in task metadata.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        skills: what the gold SQL exercises (``"join"``, ``"window"``...).
        question: ``str.format`` text over the parameters.
        sql: ``str.format`` gold SQL over the parameters (string values are
            passed already quoted by :func:`sql_str` under ``<name>_sql``).
        sample: ``(pools, rng) -> params``.
        held_out: drawn only for the test split (a kind of question train never shows).
    """

    id: str
    difficulty: str
    skills: tuple[str, ...]
    question: str
    sql: str
    sample: Callable[[Mapping[str, list], Random], dict[str, Any]]
    held_out: bool = False

    def render(self, params: Mapping[str, Any]) -> tuple[str, str]:
        """The (question, gold SQL) for ``params``."""
        quoted = {f"{k}_sql": sql_str(v) for k, v in params.items() if isinstance(v, str)}
        values = {**params, **quoted}
        return self.question.format(**values), " ".join(self.sql.format(**values).split())


def _window(rng: Random, first: date, days: int) -> dict[str, Any]:
    """A date window: ``start`` (ISO) drawn over ``days`` days from ``first``, ``end``
    one to eight weeks later."""
    start = first + timedelta(days=int(rng.random() * days))
    end = start + timedelta(days=_pick(rng, (6, 13, 20, 27, 41, 55)))
    return {"start": start.isoformat(), "end": end.isoformat()}


def _month(rng: Random) -> dict[str, Any]:
    month = 1 + int(rng.random() * 12)
    return {"month": month, "month_name": _MONTHS[month - 1]}


# Pools: values templates draw from, read once per database in a fixed order.
POOLS: dict[str, dict[str, str]] = {
    "flights": {
        "routes": "SELECT DISTINCT origin, dest FROM flights ORDER BY 1, 2",
        "origins": "SELECT DISTINCT origin FROM flights ORDER BY 1",
        "carriers": "SELECT carrier, name FROM airlines WHERE carrier IN "
        "(SELECT carrier FROM flights) ORDER BY 1",
        "dests": "SELECT DISTINCT f.dest, a.name FROM flights f JOIN airports a ON f.dest = a.faa "
        "ORDER BY 1",
        "makers": "SELECT manufacturer FROM planes GROUP BY 1 HAVING count(*) >= 50 ORDER BY 1",
    },
    "tpch": {
        "segments": "SELECT DISTINCT c_mktsegment FROM customer ORDER BY 1",
        "types": "SELECT DISTINCT p_type FROM part ORDER BY 1",
        "priorities": "SELECT DISTINCT o_orderpriority FROM orders ORDER BY 1",
        "modes": "SELECT DISTINCT l_shipmode FROM lineitem ORDER BY 1",
        "nations": "SELECT n_name FROM nation ORDER BY 1",
        "regions": "SELECT r_name FROM region ORDER BY 1",
    },
    "shop": {
        "cities": "SELECT DISTINCT city, country FROM customers ORDER BY 1",
        "countries": "SELECT DISTINCT country FROM customers ORDER BY 1",
        "categories": "SELECT DISTINCT category FROM products ORDER BY 1",
        "segments": "SELECT DISTINCT segment FROM customers ORDER BY 1",
        "statuses": "SELECT DISTINCT status FROM orders ORDER BY 1",
        "departments": "SELECT DISTINCT department FROM employees ORDER BY 1",
        "customers": "SELECT customer_id, name FROM customers ORDER BY 1",
        "products": "SELECT DISTINCT name FROM products ORDER BY 1",
    },
}


def _flights_templates() -> list[Template]:
    def route_month(p, r):
        origin, dest = _pick(r, p["routes"])
        return {"origin": origin, "dest": dest, **_month(r)}

    def route_day(p, r):
        origin, dest = _pick(r, p["routes"])
        return {"origin": origin, "dest": dest, **_month(r), "day": 1 + int(r.random() * 28)}

    def origin_day(p, r):
        return {"origin": _pick(r, p["origins"])[0], **_month(r), "day": 1 + int(r.random() * 28)}

    def maker(p, r):
        return {
            "maker": _pick(r, p["makers"])[0],
            "year": 1990 + int(r.random() * 16),
            "seats": _pick(r, (20, 50, 100, 150, 200)),
        }

    def carrier_origin_month(p, r):
        _, name = _pick(r, p["carriers"])
        return {"carrier_name": name, "origin": _pick(r, p["origins"])[0], **_month(r)}

    def dest(p, r):
        _, name = _pick(r, p["dests"])
        return {"dest_name": name, **_month(r)}

    def origin_month_k(p, r):
        return {"origin": _pick(r, p["origins"])[0], **_month(r), "k": _pick(r, (3, 5, 10))}

    def origin_month_n(p, r):
        n = _pick(r, (50, 200, 500, 1000))
        return {"origin": _pick(r, p["origins"])[0], **_month(r), "n": n}

    def month_only(p, r):
        return {**_month(r), "origin": _pick(r, p["origins"])[0]}

    def weather(p, r):
        t = 20 + 5 * int(r.random() * 15)
        return {"origin": _pick(r, p["origins"])[0], **_month(r), "t": t}

    def maker_k(p, r):
        return {"maker": _pick(r, p["makers"])[0], "k": _pick(r, (3, 5)), **_month(r)}

    T = Template
    return [
        T(
            "flights/route_count",
            "easy",
            ("filter", "aggregation"),
            "How many flights flew from {origin} to {dest} in {month_name} 2013? Cancelled "
            "flights (those that never departed) do not count.",
            "SELECT COUNT(*) FROM flights WHERE origin = {origin_sql} AND dest = {dest_sql} "
            "AND month = {month} AND dep_time IS NOT NULL",
            route_month,
        ),
        T(
            "flights/day_route_count",
            "easy",
            ("filter", "aggregation"),
            "How many flights flew from {origin} to {dest} on {month_name} {day}, 2013? Cancelled "
            "flights (those that never departed) do not count.",
            "SELECT COUNT(*) FROM flights WHERE origin = {origin_sql} AND dest = {dest_sql} "
            "AND month = {month} AND day = {day} AND dep_time IS NOT NULL",
            route_day,
        ),
        T(
            "flights/cancelled_share",
            "medium",
            ("filter", "aggregation"),
            "What percentage of the flights scheduled to leave {origin} in {month_name} 2013 were "
            "cancelled (never departed)? Round to 2 decimal places.",
            "SELECT ROUND(100.0 * COUNT(*) FILTER (WHERE dep_time IS NULL) / COUNT(*), 2) "
            "FROM flights WHERE origin = {origin_sql} AND month = {month}",
            month_only,
            held_out=True,
        ),
        T(
            "flights/max_delay_day",
            "easy",
            ("filter", "aggregation"),
            "What was the longest departure delay, in minutes, of a flight leaving {origin} on "
            "{month_name} {day}, 2013?",
            "SELECT MAX(dep_delay) FROM flights WHERE origin = {origin_sql} AND month = {month} "
            "AND day = {day}",
            origin_day,
        ),
        T(
            "flights/planes_filter",
            "easy",
            ("filter",),
            "List the tail numbers of planes made by {maker} in {year} or later with more than "
            "{seats} seats.",
            "SELECT tailnum FROM planes WHERE manufacturer = {maker_sql} AND year >= {year} "
            "AND seats > {seats}",
            maker,
        ),
        T(
            "flights/carrier_count",
            "medium",
            ("join", "filter", "aggregation"),
            "How many flights did {carrier_name} schedule from {origin} in {month_name} 2013, "
            "cancelled ones included?",
            "SELECT COUNT(*) FROM flights f JOIN airlines a ON f.carrier = a.carrier "
            "WHERE a.name = {carrier_name_sql} AND f.origin = {origin_sql} AND f.month = {month}",
            carrier_origin_month,
        ),
        T(
            "flights/avg_arrival_delay",
            "medium",
            ("join", "aggregation"),
            "What was the average arrival delay in minutes, rounded to 2 decimal places, of "
            "flights to {dest_name} in {month_name} 2013?",
            "SELECT ROUND(AVG(f.arr_delay), 2) FROM flights f JOIN airports a ON f.dest = a.faa "
            "WHERE a.name = {dest_name_sql} AND f.month = {month}",
            dest,
        ),
        T(
            "flights/top_destinations",
            "medium",
            ("grouping", "ordering"),
            "Which {k} destinations had the most scheduled flights from {origin} in {month_name} "
            "2013 (cancelled ones included)? Give each destination code and its number of "
            "flights, most flights first (ties broken by destination code).",
            "SELECT dest, COUNT(*) AS n FROM flights "
            "WHERE origin = {origin_sql} AND month = {month} "
            "GROUP BY dest ORDER BY n DESC, dest LIMIT {k}",
            origin_month_k,
        ),
        T(
            "flights/busy_carriers",
            "medium",
            ("grouping", "having"),
            "Which carriers scheduled more than {n} flights from {origin} in {month_name} 2013 "
            "(cancelled ones included)? List their two-letter codes alphabetically.",
            "SELECT carrier FROM flights WHERE origin = {origin_sql} AND month = {month} "
            "GROUP BY carrier HAVING COUNT(*) > {n} ORDER BY carrier",
            origin_month_n,
        ),
        T(
            "flights/late_airlines",
            "hard",
            ("join", "nested", "having"),
            "Which airlines had a higher average departure delay on flights from {origin} in "
            "{month_name} 2013 than the average over all flights from {origin} that month? "
            "List the airline names alphabetically.",
            "SELECT a.name FROM flights f JOIN airlines a ON f.carrier = a.carrier "
            "WHERE f.origin = {origin_sql} AND f.month = {month} GROUP BY a.name "
            "HAVING AVG(f.dep_delay) > (SELECT AVG(dep_delay) FROM flights "
            "WHERE origin = {origin_sql} AND month = {month}) ORDER BY a.name",
            month_only,
            held_out=True,
        ),
        T(
            "flights/daily_top_destination",
            "hard",
            ("window", "grouping"),
            "For each day of {month_name} 2013, which destination had the most scheduled flights "
            "from {origin}? Give the day of the month, the destination code and the number of "
            "flights, ordered by day; if destinations tie, take the alphabetically first code.",
            "WITH c AS (SELECT day, dest, COUNT(*) AS n FROM flights WHERE origin = {origin_sql} "
            "AND month = {month} GROUP BY day, dest), r AS (SELECT day, dest, n, ROW_NUMBER() "
            "OVER (PARTITION BY day ORDER BY n DESC, dest) AS rk FROM c) "
            "SELECT day, dest, n FROM r WHERE rk = 1 ORDER BY day",
            month_only,
        ),
        T(
            "flights/warm_days",
            "hard",
            ("nested", "grouping", "having"),
            "On how many days of {month_name} 2013 was the average hourly temperature recorded "
            "at {origin} above {t} degrees Fahrenheit?",
            "SELECT COUNT(*) FROM (SELECT day FROM weather WHERE origin = {origin_sql} "
            "AND month = {month} GROUP BY day HAVING AVG(temp) > {t}) AS d",
            weather,
        ),
        T(
            "flights/far_planes",
            "hard",
            ("join", "grouping", "ordering"),
            "Which {k} planes made by {maker} flew the greatest total distance in {month_name} "
            "2013? Give the tail number and the total distance in miles, largest first "
            "(ties broken by tail number).",
            "SELECT p.tailnum, SUM(f.distance) AS total FROM flights f JOIN planes p "
            "ON f.tailnum = p.tailnum WHERE p.manufacturer = {maker_sql} AND f.month = {month} "
            "AND f.dep_time IS NOT NULL GROUP BY p.tailnum "
            "ORDER BY total DESC, p.tailnum LIMIT {k}",
            maker_k,
        ),
    ]


def _tpch_templates() -> list[Template]:
    def year(r):
        return 1992 + int(r.random() * 6)

    def segment_balance(p, r):
        return {"segment": _pick(r, p["segments"])[0], "balance": 1000 * int(r.random() * 9)}

    def part_type(p, r):
        return {"type": _pick(r, p["types"])[0], "size": 1 + int(r.random() * 40)}

    def priority_year(p, r):
        return {"priority": _pick(r, p["priorities"])[0], "year": year(r), **_month(r)}

    def nation_segment(p, r):
        return {"nation": _pick(r, p["nations"])[0], "segment": _pick(r, p["segments"])[0]}

    def mode_year(p, r):
        return {"mode": _pick(r, p["modes"])[0], "year": year(r), **_month(r)}

    def quarter(p, r):
        return {"year": year(r), "quarter": 1 + int(r.random() * 4)}

    def top_customers(p, r):
        return {"year": year(r), "k": _pick(r, (3, 5, 10)), "nation": _pick(r, p["nations"])[0]}

    def region_segment(p, r):
        return {"region": _pick(r, p["regions"])[0], "segment": _pick(r, p["segments"])[0]}

    def priority_window(p, r):
        return {"priority": _pick(r, p["priorities"])[0], **_window(r, date(1992, 1, 1), 2400)}

    def region_nation(p, r):
        return {"region": _pick(r, p["regions"])[0], "nation": _pick(r, p["nations"])[0]}

    def month_year(p, r):
        return {"year": year(r), **_month(r)}

    T = Template
    return [
        T(
            "tpch/rich_customers",
            "easy",
            ("filter", "aggregation"),
            "How many customers in the {segment} market segment have an account balance above "
            "{balance}?",
            "SELECT COUNT(*) FROM customer WHERE c_mktsegment = {segment_sql} "
            "AND c_acctbal > {balance}",
            segment_balance,
        ),
        T(
            "tpch/parts_of_type",
            "easy",
            ("filter", "ordering"),
            "List the names of parts of type {type} with a size of at least {size}, "
            "in alphabetical order.",
            "SELECT p_name FROM part WHERE p_type = {type_sql} AND p_size >= {size} "
            "ORDER BY p_name",
            part_type,
        ),
        T(
            "tpch/orders_by_priority",
            "easy",
            ("filter", "aggregation"),
            "How many orders with priority {priority} were placed in {month_name} {year}?",
            "SELECT COUNT(*) FROM orders WHERE o_orderpriority = {priority_sql} "
            "AND year(o_orderdate) = {year} AND month(o_orderdate) = {month}",
            priority_year,
        ),
        T(
            "tpch/orders_in_window",
            "easy",
            ("filter", "aggregation"),
            "How many orders with priority {priority} were placed from {start} to {end} "
            "(both days included)?",
            "SELECT COUNT(*) FROM orders WHERE o_orderpriority = {priority_sql} "
            "AND o_orderdate BETWEEN DATE '{start}' AND DATE '{end}'",
            priority_window,
        ),
        T(
            "tpch/nation_customers",
            "medium",
            ("join", "filter", "aggregation"),
            "How many customers from {nation} belong to the {segment} market segment?",
            "SELECT COUNT(*) FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey "
            "WHERE n.n_name = {nation_sql} AND c.c_mktsegment = {segment_sql}",
            nation_segment,
        ),
        T(
            "tpch/shipmode_revenue",
            "medium",
            ("filter", "aggregation"),
            "What was the revenue (the sum of extended price times one minus the discount), "
            "rounded to 2 decimal places, of line items shipped by {mode} in {month_name} {year}?",
            "SELECT ROUND(SUM(l_extendedprice * (1 - l_discount)), 2) FROM lineitem "
            "WHERE l_shipmode = {mode_sql} AND year(l_shipdate) = {year} "
            "AND month(l_shipdate) = {month}",
            mode_year,
        ),
        T(
            "tpch/priority_counts",
            "medium",
            ("grouping", "ordering"),
            "For each order priority, how many orders were placed in quarter {quarter} of {year}? "
            "Give the priority and the number of orders, ordered by priority.",
            "SELECT o_orderpriority, COUNT(*) AS n FROM orders WHERE year(o_orderdate) = {year} "
            "AND quarter(o_orderdate) = {quarter} GROUP BY o_orderpriority "
            "ORDER BY o_orderpriority",
            quarter,
        ),
        T(
            "tpch/top_spenders",
            "medium",
            ("join", "grouping", "ordering"),
            "Which {k} customers from {nation} spent the most on orders placed in {year}? Give the "
            "customer name and the total price of their orders, largest first (ties broken by "
            "name).",
            "SELECT c.c_name, SUM(o.o_totalprice) AS total FROM customer c JOIN orders o "
            "ON c.c_custkey = o.o_custkey JOIN nation n ON c.c_nationkey = n.n_nationkey "
            "WHERE n.n_name = {nation_sql} AND year(o.o_orderdate) = {year} GROUP BY c.c_name "
            "ORDER BY total DESC, c.c_name LIMIT {k}",
            top_customers,
        ),
        T(
            "tpch/rich_suppliers",
            "hard",
            ("join", "nested"),
            "Which suppliers in the {region} region have an account balance above the average "
            "account balance of all suppliers in {region}? List their names alphabetically.",
            "SELECT s.s_name FROM supplier s JOIN nation n ON s.s_nationkey = n.n_nationkey "
            "JOIN region r ON n.n_regionkey = r.r_regionkey WHERE r.r_name = {region_sql} "
            "AND s.s_acctbal > (SELECT AVG(s2.s_acctbal) FROM supplier s2 JOIN nation n2 "
            "ON s2.s_nationkey = n2.n_nationkey JOIN region r2 ON n2.n_regionkey = r2.r_regionkey "
            "WHERE r2.r_name = {region_sql}) ORDER BY s.s_name",
            region_nation,
            held_out=True,
        ),
        T(
            "tpch/richest_per_nation",
            "hard",
            ("join", "window"),
            "For each nation in the {region} region, which customer of the {segment} market "
            "segment has the highest account balance? Give the nation name, the customer name "
            "and the balance, ordered by nation name.",
            "WITH ranked AS (SELECT n.n_name, c.c_name, c.c_acctbal, ROW_NUMBER() OVER "
            "(PARTITION BY n.n_name ORDER BY c.c_acctbal DESC, c.c_name) AS rk FROM customer c "
            "JOIN nation n ON c.c_nationkey = n.n_nationkey JOIN region r "
            "ON n.n_regionkey = r.r_regionkey WHERE r.r_name = {region_sql} "
            "AND c.c_mktsegment = {segment_sql}) SELECT n_name, c_name, c_acctbal FROM ranked "
            "WHERE rk = 1 ORDER BY n_name",
            region_segment,
        ),
        T(
            "tpch/late_orders",
            "hard",
            ("nested", "exists"),
            "How many orders placed in {month_name} {year} have at least one line item that was "
            "received after its commit date?",
            "SELECT COUNT(*) FROM orders o WHERE year(o.o_orderdate) = {year} "
            "AND month(o.o_orderdate) = {month} AND EXISTS (SELECT 1 FROM lineitem l "
            "WHERE l.l_orderkey = o.o_orderkey AND l.l_receiptdate > l.l_commitdate)",
            month_year,
        ),
    ]


def _shop_templates() -> list[Template]:
    def year(r):
        return 2021 + int(r.random() * 3)

    def city_segment(p, r):
        return {"city": _pick(r, p["cities"])[0], "segment": _pick(r, p["segments"])[0]}

    def category_price(p, r):
        return {"category": _pick(r, p["categories"])[0], "price": 5 + int(r.random() * 186)}

    def status_window(p, r):
        return {"status": _pick(r, p["statuses"])[0], **_window(r, date(2021, 1, 1), 1040)}

    def product_month(p, r):
        return {"product": _pick(r, p["products"])[0], "year": year(r), **_month(r)}

    def customer_year(p, r):
        customer_id, name = _pick(r, p["customers"])
        return {"customer_id": customer_id, "name": name, "year": year(r)}

    def customer_category(p, r):
        customer_id, name = _pick(r, p["customers"])
        return {"customer_id": customer_id, "name": name, "category": _pick(r, p["categories"])[0]}

    def department_salary(p, r):
        return {
            "department": _pick(r, p["departments"])[0],
            "salary": 1000 * int(35 + r.random() * 80),
        }

    def status_year(p, r):
        return {"status": _pick(r, p["statuses"])[0], "year": year(r), **_month(r)}

    def category_year(p, r):
        return {"category": _pick(r, p["categories"])[0], "year": year(r)}

    def country_n(p, r):
        return {"country": _pick(r, p["countries"])[0], "n": _pick(r, (6, 8, 10, 12))}

    def segment_year(p, r):
        return {"segment": _pick(r, p["segments"])[0], "year": year(r), **_month(r)}

    def department_year(p, r):
        return {"department": _pick(r, p["departments"])[0], "year": 2010 + int(r.random() * 10)}

    def two_categories(p, r):
        return {"category": _pick(r, p["categories"])[0], "other": _pick(r, p["categories"])[0]}

    def country_year(p, r):
        return {"country": _pick(r, p["countries"])[0], "year": year(r)}

    def city_category(p, r):
        return {"city": _pick(r, p["cities"])[0], "category": _pick(r, p["categories"])[0]}

    T = Template
    revenue = "oi.quantity * oi.unit_price"
    return [
        T(
            "shop/customers_in_city",
            "easy",
            ("filter", "ordering"),
            "List the names of customers from {city} in the {segment} segment, alphabetically.",
            "SELECT name FROM customers WHERE city = {city_sql} AND segment = {segment_sql} "
            "ORDER BY name",
            city_segment,
        ),
        T(
            "shop/pricey_products",
            "easy",
            ("filter", "aggregation"),
            "How many products in the {category} category cost more than {price}?",
            "SELECT COUNT(*) FROM products WHERE category = {category_sql} AND price > {price}",
            category_price,
        ),
        T(
            "shop/orders_by_status",
            "easy",
            ("filter", "aggregation"),
            "How many orders placed in {month_name} {year} have the status {status}?",
            "SELECT COUNT(*) FROM orders WHERE status = {status_sql} AND year(order_date) = {year} "
            "AND month(order_date) = {month}",
            status_year,
        ),
        T(
            "shop/orders_in_window",
            "easy",
            ("filter", "aggregation"),
            "How many orders placed from {start} to {end} (both days included) have the status "
            "{status}?",
            "SELECT COUNT(*) FROM orders WHERE status = {status_sql} "
            "AND order_date BETWEEN DATE '{start}' AND DATE '{end}'",
            status_window,
        ),
        T(
            "shop/well_paid",
            "easy",
            ("filter", "ordering"),
            "Which employees of the {department} department earn at least {salary}? Give their "
            "names alphabetically.",
            "SELECT name FROM employees WHERE department = {department_sql} "
            "AND salary >= {salary} ORDER BY name",
            department_salary,
        ),
        T(
            "shop/customer_orders",
            "medium",
            ("join", "filter", "aggregation"),
            "How many items (the sum of quantities) did customer {customer_id} ({name}) order in "
            "{year}, counting orders of every status?",
            "SELECT SUM(oi.quantity) FROM orders o JOIN order_items oi ON o.order_id = oi.order_id "
            "WHERE o.customer_id = {customer_id} AND year(o.order_date) = {year}",
            customer_year,
        ),
        T(
            "shop/product_units",
            "medium",
            ("join", "filter", "aggregation"),
            "How many units of the product {product} were sold in orders placed in {month_name} "
            "{year}, whatever their status?",
            "SELECT SUM(oi.quantity) FROM order_items oi JOIN orders o ON oi.order_id = o.order_id "
            "JOIN products p ON oi.product_id = p.product_id WHERE p.name = {product_sql} "
            "AND year(o.order_date) = {year} AND month(o.order_date) = {month}",
            product_month,
        ),
        T(
            "shop/customer_category_spend",
            "medium",
            ("join", "filter", "aggregation"),
            "How much did customer {customer_id} ({name}) spend (quantity times unit price) on "
            "{category} products over all their orders? Round to 2 decimal places.",
            f"SELECT ROUND(SUM({revenue}), 2) FROM orders o JOIN order_items oi "
            "ON o.order_id = oi.order_id JOIN products p ON oi.product_id = p.product_id "
            "WHERE o.customer_id = {customer_id} AND p.category = {category_sql}",
            customer_category,
            held_out=True,
        ),
        T(
            "shop/category_revenue",
            "medium",
            ("join", "aggregation"),
            "What was the revenue (quantity times unit price) from {category} products in orders "
            "placed in {year}, rounded to 2 decimal places? Count orders of every status.",
            f"SELECT ROUND(SUM({revenue}), 2) FROM order_items oi JOIN orders o "
            "ON oi.order_id = o.order_id JOIN products p ON oi.product_id = p.product_id "
            "WHERE p.category = {category_sql} AND year(o.order_date) = {year}",
            category_year,
        ),
        T(
            "shop/loyal_customers",
            "medium",
            ("join", "grouping", "having"),
            "Which customers from {country} placed at least {n} orders? Give their customer ids "
            "and names, ordered by id.",
            "SELECT c.customer_id, c.name FROM customers c JOIN orders o "
            "ON c.customer_id = o.customer_id WHERE c.country = {country_sql} "
            "GROUP BY c.customer_id, c.name HAVING COUNT(*) >= {n} ORDER BY c.customer_id",
            country_n,
        ),
        T(
            "shop/items_per_order",
            "medium",
            ("join", "nested", "aggregation"),
            "On average, how many items (the sum of quantities) did an order contain among orders "
            "placed by {segment} customers in {month_name} {year}? Round to 2 decimal places.",
            "SELECT ROUND(AVG(items), 2) FROM (SELECT o.order_id, SUM(oi.quantity) AS items "
            "FROM orders o JOIN customers c ON o.customer_id = c.customer_id JOIN order_items oi "
            "ON o.order_id = oi.order_id WHERE c.segment = {segment_sql} AND year(o.order_date) "
            "= {year} AND month(o.order_date) = {month} GROUP BY o.order_id) AS t",
            segment_year,
        ),
        T(
            "shop/overpaid_employees",
            "hard",
            ("self_join", "filter"),
            "Which employees of the {department} department hired in {year} or later earn more "
            "than their manager? Give their names alphabetically.",
            "SELECT e.name FROM employees e JOIN employees m ON e.manager_id = m.employee_id "
            "WHERE e.department = {department_sql} AND e.hire_date >= DATE '{year}-01-01' "
            "AND e.salary > m.salary ORDER BY e.name",
            department_year,
        ),
        T(
            "shop/above_other_average",
            "hard",
            ("nested", "filter"),
            "Which products in the {category} category cost more than the average price of "
            "{other} products? Give their names alphabetically.",
            "SELECT name FROM products WHERE category = {category_sql} AND price > "
            "(SELECT AVG(price) FROM products WHERE category = {other_sql}) ORDER BY name",
            two_categories,
            held_out=True,
        ),
        T(
            "shop/best_product_per_category",
            "hard",
            ("join", "window"),
            "For each product category, which product brought the most revenue (quantity times "
            "unit price) from customers in {country} in {year}? Give the category, the product "
            "name and its revenue, ordered by category; ties go to the lower product id.",
            f"WITH rev AS (SELECT p.category, p.product_id, p.name, SUM({revenue}) AS revenue "
            "FROM order_items oi JOIN orders o ON oi.order_id = o.order_id JOIN customers c "
            "ON o.customer_id = c.customer_id JOIN products p ON oi.product_id = p.product_id "
            "WHERE c.country = {country_sql} AND year(o.order_date) = {year} "
            "GROUP BY p.category, p.product_id, p.name), ranked AS (SELECT *, ROW_NUMBER() OVER "
            "(PARTITION BY category ORDER BY revenue DESC, product_id) AS rk FROM rev) "
            "SELECT category, name, revenue FROM ranked WHERE rk = 1 ORDER BY category",
            country_year,
        ),
        T(
            "shop/never_bought",
            "hard",
            ("nested", "not_exists"),
            "How many customers from {city} never ordered a product of the {category} category?",
            "SELECT COUNT(*) FROM customers c WHERE c.city = {city_sql} AND NOT EXISTS "
            "(SELECT 1 FROM orders o JOIN order_items oi ON o.order_id = oi.order_id "
            "JOIN products p ON oi.product_id = p.product_id WHERE o.customer_id = c.customer_id "
            "AND p.category = {category_sql})",
            city_category,
        ),
        T(
            "shop/running_revenue",
            "hard",
            ("grouping", "window"),
            "For each month of {year}, what was the revenue (quantity times unit price) of "
            "delivered orders from customers in {country}, and the running total since January? "
            "Give the month number, the month's revenue and the running total, ordered by month.",
            f"WITH m AS (SELECT month(o.order_date) AS month, SUM({revenue}) AS revenue "
            "FROM orders o JOIN order_items oi ON o.order_id = oi.order_id JOIN customers c "
            "ON o.customer_id = c.customer_id WHERE o.status = 'delivered' AND c.country = "
            "{country_sql} AND year(o.order_date) = {year} GROUP BY month(o.order_date)) "
            "SELECT month, revenue, SUM(revenue) OVER (ORDER BY month) AS running_total FROM m "
            "ORDER BY month",
            country_year,
        ),
    ]


TEMPLATES: dict[str, list[Template]] = {
    "flights": _flights_templates(),
    "tpch": _tpch_templates(),
    "shop": _shop_templates(),
}


def _mentioned(value: Any, question: str) -> bool:
    text = format_value(value, max_chars=1000)
    return re.search(r"(?<![\w.])" + re.escape(text) + r"(?![\w.])", question) is not None


def check_gold(
    con: duckdb.DuckDBPyConnection, sql: str, question: str, *, timeout_s: float = 10.0
) -> str | None:
    """Why ``sql`` is not a usable gold query for ``question``, or ``None`` if it is.

    Usable: it runs (twice, with equal results), returns at least one row
    with a non-NULL value, and its result is not written out in the question
    (every value of a one-row or one-column result appearing there).
    """
    first = execute_query(con, sql, timeout_s=timeout_s)
    if not first.ok:
        return f"gold failed: {first.error}: {first.message}"
    if not first.rows or all(v is None for row in first.rows for v in row):
        return "empty result"
    second = execute_query(con, sql, timeout_s=timeout_s)
    order = has_top_level_order_by(sql)
    if not second.ok or not results_match(first.rows, second.rows, order_matters=order):
        return "nondeterministic result"
    values = [v for row in first.rows for v in row]
    if (len(first.rows) == 1 or len(first.columns) == 1) and all(
        _mentioned(v, question) for v in values
    ):
        return "answer appears in the question"
    return None


@dataclass(frozen=True)
class GeneratedQuestion:
    """A checked question: its text, gold SQL, template and parameters."""

    question: str
    sql: str
    template: Template
    params: Mapping[str, Any] = field(default_factory=dict)


def split_of(sql: str, held_out: bool = False) -> str:
    """``"test"`` for a held-out template's question or the held-out hash bucket,
    else ``"train"``."""
    if held_out:
        return "test"
    bucket = int(hashlib.sha256(sql.encode()).hexdigest(), 16) % _TEST_BUCKETS
    return "test" if bucket == 0 else "train"


class QuestionBank:
    """Checked questions of one embedded database, drawn deterministically.

    ``question(split, k)`` is a pure function of (database, split, k); for the
    test split it is the k-th *distinct* question, so the held-out set has no
    repeats.
    """

    def __init__(self, db_name: str, db_path: str):
        self.db_name, self.db_path = db_name, str(db_path)
        self.templates = TEMPLATES[db_name]
        self._test: list[GeneratedQuestion] = []
        self._test_seen: set[str] = set()
        self._test_draws = 0

    @functools.cached_property
    def _con(self) -> duckdb.DuckDBPyConnection:
        return connect_readonly(self.db_path)

    @functools.cached_property
    def pools(self) -> dict[str, list[tuple]]:
        queries = POOLS[self.db_name]
        return {name: self._con.execute(sql).fetchall() for name, sql in queries.items()}

    def _draw(self, split: str, stream: int) -> GeneratedQuestion | None:
        rng = Random(f"vt-sql/{self.db_name}/{split}/{stream}")
        allowed = [t for t in self.templates if split == "test" or not t.held_out]
        template = _pick(rng, allowed)
        for _ in range(_PARAM_TRIES):
            params = template.sample(self.pools, rng)
            question, sql = template.render(params)
            if split_of(sql, template.held_out) == split:
                break
        else:
            return None
        if check_gold(self._con, sql, question) is not None:
            return None
        return GeneratedQuestion(question, sql, template, params)

    def question(self, split: str, k: int) -> GeneratedQuestion:
        """The ``k``-th question of ``split``."""
        if split == "test":
            while len(self._test) <= k:
                self._test.append(self._next_distinct_test())
            return self._test[k]
        for attempt in range(_MAX_ATTEMPTS):
            found = self._draw(split, k * _MAX_ATTEMPTS + attempt)
            if found is not None:
                return found
        raise RuntimeError(f"no usable {self.db_name} question for {split}/{k}")  # a template bug

    def _next_distinct_test(self) -> GeneratedQuestion:
        for _ in range(_MAX_ATTEMPTS):
            self._test_draws += 1
            found = self._draw("test", self._test_draws)
            if found is not None and found.sql not in self._test_seen:
                self._test_seen.add(found.sql)
                return found
        raise RuntimeError(
            f"the {self.db_name} templates ran out of distinct test questions after "
            f"{len(self._test)}; use a smaller test size"
        )

    def close(self) -> None:
        if "_con" in self.__dict__:
            self.__dict__.pop("_con").close()
