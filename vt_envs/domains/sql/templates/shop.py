"""Question templates over the online shop (customers, orders, order items, products, employees).

``POOLS`` are the values the templates draw from (read once, in this order);
:func:`templates` are the kinds of question, in draw order (do not reorder:
task ``k`` of a split depends on it).
"""

from __future__ import annotations

from datetime import date

from vt_envs.domains.sql.templates.base import Template, draw_month, draw_window, pick

__all__ = ["POOLS", "templates"]

POOLS: dict[str, str] = {
    "cities": "SELECT DISTINCT city, country FROM customers ORDER BY 1",
    "countries": "SELECT DISTINCT country FROM customers ORDER BY 1",
    "categories": "SELECT DISTINCT category FROM products ORDER BY 1",
    "segments": "SELECT DISTINCT segment FROM customers ORDER BY 1",
    "statuses": "SELECT DISTINCT status FROM orders ORDER BY 1",
    "departments": "SELECT DISTINCT department FROM employees ORDER BY 1",
    "customers": "SELECT customer_id, name FROM customers ORDER BY 1",
    "products": "SELECT DISTINCT name FROM products ORDER BY 1",
}


def templates() -> list[Template]:
    def year(r):
        return 2021 + int(r.random() * 3)

    def city_segment(p, r):
        return {"city": pick(r, p["cities"])[0], "segment": pick(r, p["segments"])[0]}

    def category_price(p, r):
        return {"category": pick(r, p["categories"])[0], "price": 5 + int(r.random() * 186)}

    def status_window(p, r):
        return {"status": pick(r, p["statuses"])[0], **draw_window(r, date(2021, 1, 1), 1040)}

    def product_month(p, r):
        return {"product": pick(r, p["products"])[0], "year": year(r), **draw_month(r)}

    def customer_year(p, r):
        customer_id, name = pick(r, p["customers"])
        return {"customer_id": customer_id, "name": name, "year": year(r)}

    def customer_category(p, r):
        customer_id, name = pick(r, p["customers"])
        return {"customer_id": customer_id, "name": name, "category": pick(r, p["categories"])[0]}

    def department_salary(p, r):
        return {
            "department": pick(r, p["departments"])[0],
            "salary": 1000 * int(35 + r.random() * 80),
        }

    def status_year(p, r):
        return {"status": pick(r, p["statuses"])[0], "year": year(r), **draw_month(r)}

    def category_year(p, r):
        return {"category": pick(r, p["categories"])[0], "year": year(r)}

    def country_n(p, r):
        return {"country": pick(r, p["countries"])[0], "n": pick(r, (6, 8, 10, 12))}

    def segment_year(p, r):
        return {"segment": pick(r, p["segments"])[0], "year": year(r), **draw_month(r)}

    def department_year(p, r):
        return {"department": pick(r, p["departments"])[0], "year": 2010 + int(r.random() * 10)}

    def two_categories(p, r):
        return {"category": pick(r, p["categories"])[0], "other": pick(r, p["categories"])[0]}

    def country_year(p, r):
        return {"country": pick(r, p["countries"])[0], "year": year(r)}

    def city_category(p, r):
        return {"city": pick(r, p["cities"])[0], "category": pick(r, p["categories"])[0]}

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
