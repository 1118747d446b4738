"""Question templates over the TPC-H sample (customers, orders, line items, parts,
nations, regions).

``POOLS`` are the values the templates draw from (read once, in this order);
:func:`templates` are the kinds of question, in draw order (do not reorder:
task ``k`` of a split depends on it).
"""

from __future__ import annotations

from datetime import date

from vt_envs.domains.sql.templates.base import Template, draw_month, draw_window, pick

__all__ = ["POOLS", "templates"]

POOLS: dict[str, str] = {
    "segments": "SELECT DISTINCT c_mktsegment FROM customer ORDER BY 1",
    "types": "SELECT DISTINCT p_type FROM part ORDER BY 1",
    "priorities": "SELECT DISTINCT o_orderpriority FROM orders ORDER BY 1",
    "modes": "SELECT DISTINCT l_shipmode FROM lineitem ORDER BY 1",
    "nations": "SELECT n_name FROM nation ORDER BY 1",
    "regions": "SELECT r_name FROM region ORDER BY 1",
}


def templates() -> list[Template]:
    def year(r):
        return 1992 + int(r.random() * 6)

    def segment_balance(p, r):
        return {"segment": pick(r, p["segments"])[0], "balance": 1000 * int(r.random() * 9)}

    def part_type(p, r):
        return {"type": pick(r, p["types"])[0], "size": 1 + int(r.random() * 40)}

    def priority_year(p, r):
        return {"priority": pick(r, p["priorities"])[0], "year": year(r), **draw_month(r)}

    def nation_segment(p, r):
        return {"nation": pick(r, p["nations"])[0], "segment": pick(r, p["segments"])[0]}

    def mode_year(p, r):
        return {"mode": pick(r, p["modes"])[0], "year": year(r), **draw_month(r)}

    def quarter(p, r):
        return {"year": year(r), "quarter": 1 + int(r.random() * 4)}

    def top_customers(p, r):
        return {"year": year(r), "k": pick(r, (3, 5, 10)), "nation": pick(r, p["nations"])[0]}

    def region_segment(p, r):
        return {"region": pick(r, p["regions"])[0], "segment": pick(r, p["segments"])[0]}

    def priority_window(p, r):
        return {"priority": pick(r, p["priorities"])[0], **draw_window(r, date(1992, 1, 1), 2400)}

    def region_nation(p, r):
        return {"region": pick(r, p["regions"])[0], "nation": pick(r, p["nations"])[0]}

    def month_year(p, r):
        return {"year": year(r), **draw_month(r)}

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
