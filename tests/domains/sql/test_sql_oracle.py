"""The SQL oracle's exploration query."""

from vt_envs.core.task import Task
from vt_envs.domains.sql.oracle import SQLOracle, first_table


def test_first_table():
    assert first_table("SELECT a FROM flights f JOIN airlines a ON 1") == "flights"
    assert first_table('select * from "Concert Hall" h') == '"Concert Hall"'
    assert first_table("WITH c AS (SELECT x FROM orders) SELECT * FROM c") == "orders"
    assert first_table("SELECT 1") is None


def test_oracle_explores_then_answers_the_gold():
    oracle = SQLOracle()
    oracle.reset(Task("t", "q", gold="SELECT COUNT(*) FROM orders"))
    assert oracle.act("", {}) == "<sql>SELECT * FROM orders LIMIT 3</sql>"
    assert oracle.act("", {}) == "<answer>SELECT COUNT(*) FROM orders</answer>"
