"""Question templates over the 2013 New York City flights (``flights``, ``airlines``,
``airports``, ``planes``, ``weather``).

``POOLS`` are the values the templates draw from (read once, in this order);
:func:`templates` are the kinds of question, in draw order (do not reorder:
task ``k`` of a split depends on it).
"""

from __future__ import annotations

from vt_envs.domains.sql.templates.base import Template, draw_month, pick

__all__ = ["POOLS", "templates"]

POOLS: dict[str, str] = {
    "routes": "SELECT DISTINCT origin, dest FROM flights ORDER BY 1, 2",
    "origins": "SELECT DISTINCT origin FROM flights ORDER BY 1",
    "carriers": "SELECT carrier, name FROM airlines WHERE carrier IN "
    "(SELECT carrier FROM flights) ORDER BY 1",
    "dests": "SELECT DISTINCT f.dest, a.name FROM flights f JOIN airports a ON f.dest = a.faa "
    "ORDER BY 1",
    "makers": "SELECT manufacturer FROM planes GROUP BY 1 HAVING count(*) >= 50 ORDER BY 1",
}


def templates() -> list[Template]:
    def route_month(p, r):
        origin, dest = pick(r, p["routes"])
        return {"origin": origin, "dest": dest, **draw_month(r)}

    def route_day(p, r):
        origin, dest = pick(r, p["routes"])
        return {"origin": origin, "dest": dest, **draw_month(r), "day": 1 + int(r.random() * 28)}

    def origin_day(p, r):
        return {
            "origin": pick(r, p["origins"])[0],
            **draw_month(r),
            "day": 1 + int(r.random() * 28),
        }

    def maker(p, r):
        return {
            "maker": pick(r, p["makers"])[0],
            "year": 1990 + int(r.random() * 16),
            "seats": pick(r, (20, 50, 100, 150, 200)),
        }

    def carrier_origin_month(p, r):
        _, name = pick(r, p["carriers"])
        return {"carrier_name": name, "origin": pick(r, p["origins"])[0], **draw_month(r)}

    def dest(p, r):
        _, name = pick(r, p["dests"])
        return {"dest_name": name, **draw_month(r)}

    def origin_month_k(p, r):
        return {"origin": pick(r, p["origins"])[0], **draw_month(r), "k": pick(r, (3, 5, 10))}

    def origin_month_n(p, r):
        n = pick(r, (50, 200, 500, 1000))
        return {"origin": pick(r, p["origins"])[0], **draw_month(r), "n": n}

    def month_only(p, r):
        return {**draw_month(r), "origin": pick(r, p["origins"])[0]}

    def weather(p, r):
        t = 20 + 5 * int(r.random() * 15)
        return {"origin": pick(r, p["origins"])[0], **draw_month(r), "t": t}

    def maker_k(p, r):
        return {"maker": pick(r, p["makers"])[0], "k": pick(r, (3, 5)), **draw_month(r)}

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
