"""A small, license-clean training corpus for the default tokenizer.

Used only by ``scripts/build_tokenizer.py`` (it is not part of the package:
the env never trains a tokenizer).

Every document is generated here from templates with a seeded RNG, so the
corpus (and the tokenizer trained on it) is reproducible and free of outside
text. It covers what VT episodes contain: English about numbers, tables and
keys; arithmetic and algebra word problems; short Python snippets; SQL over
flights/carriers/orders/customers tables; JSON tool calls; the tool tags; and
ChatML turns. Only the *distribution* matters (which merges BPE learns), not
the truth of the sentences.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator

__all__ = ["generate_corpus"]

_NAMES = ["Alice", "Bob", "Carol", "Dan", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy"]
_ITEMS = ["apples", "books", "marbles", "tickets", "coins", "pencils", "cookies", "boxes"]
_NOUNS = ["table", "column", "row", "key", "value", "index", "record", "field", "list", "number"]
_ADJS = ["first", "last", "largest", "smallest", "total", "average", "unique", "primary"]
_VERBS = ["contains", "stores", "returns", "lists", "counts", "holds", "shows", "maps"]
_CITIES = ["Boston", "Denver", "Austin", "Seattle", "Chicago", "Miami", "Atlanta", "Dallas"]
_TABLES = {
    "flights": ["flight_id", "carrier_id", "origin", "destination", "departure", "delay", "price"],
    "carriers": ["carrier_id", "name", "country", "founded"],
    "orders": ["order_id", "customer_id", "amount", "status", "created_at"],
    "customers": ["customer_id", "name", "city", "email", "signup_date"],
}
_WORDS = """
the of and to in is that it for was on are as with his they at be this from have or by one had
not but what all were when we there can an your which their said if do will each about how up out
them then she many some so these would other into has more her two like him see time could no make
than first been its who now people my made over did down only way find use may water long little
very after words called just where most know get through back much before go good new write our
used me man too any day same right look think also around another came come work three word must
because does part even place well such here take why things help put years different away again
off went old number great tell men say small every found still between name should home big give
air line set own under read last never us left end along while might next sound below saw something
thought both few those always looked show large often together asked house world going want school
important until form food keep children feet land side without boy once animals life enough took
sometimes four head above kind began almost live page got earth need far hand high year mother light
parts country father let night following picture being study second eyes soon times story boys since
white days ever paper hard near sentence better best across during today others however sure means
knew try told young miles sun ways thing whole hear example heard several change answer room sea
against top turned learn point city play toward five using himself usually money seen car morning
given problem solve solution equation value values total sum count average minimum maximum compute
calculate result results integer integers fraction fractions decimal percent percentage ratio price
prices cost costs each per remaining remainder divide divided multiply multiplied add added subtract
subtracted square root power area perimeter length width height volume circle triangle rectangle
speed distance hours minutes seconds week weeks month months dollars cents meters kilometers grams
probability expected random sequence series prime factor factors multiple digits digit even odd
positive negative greater less equal between larger smaller twice half third quarter double triple
question questions database query queries table tables column columns schema record records join
filter group order sort ascending descending limit select distinct where having inner outer left
right primary foreign key keys index unique null default constraint view views string strings text
document documents title passage retrieve retrieval search searched lookup answer answers final step
steps reason reasoning check verify verified correct incorrect error errors output input return
function functions variable variables list lists dictionary tuple set sets loop loops condition
true false none file files directory path repository test tests patch bug fix code python program
customer customers order orders flight flights carrier carriers airline airport departure arrival
delay delayed origin destination status shipped pending cancelled amount quantity product products
employee employees salary department manager student students course courses grade score teacher
country countries population capital river mountain born died wrote film album song team season
January February March April May June July August September October November December Monday
Tuesday Wednesday Thursday Friday Saturday Sunday zero six seven eight nine ten eleven twelve
hundred thousand million billion
"""
_PY_NAMES = """
print range len sum min max abs round sorted reversed enumerate zip map filter int float str list
dict set tuple bool isinstance append extend insert pop remove keys items values get update split
join strip replace format lower upper startswith endswith count index find import from return def
class lambda yield while for if elif else try except finally raise with as assert pass break
continue global nonlocal True False None self math sqrt floor ceil gcd lcm factorial comb perm log
exp sin cos pi inf isclose fractions Fraction itertools permutations combinations product accumulate
collections Counter defaultdict deque statistics mean median mode stdev numpy np array arange zeros
ones reshape dot sympy symbols solve simplify expand factor Rational Eq diff integrate limit subs
evalf json dumps loads re findall match sub compile random seed choice randint shuffle sample os
path exists open read write readlines encoding utf result answer total value values numbers data
row rows query cursor
execute fetchall connect duckdb sqlite pandas DataFrame groupby merge head describe
"""
_VOCAB = _WORDS.split()
_IDENTS = _PY_NAMES.split()
_TAGS = [
    *("python", "sql", "search", "lookup", "answer"),
    *("tool_call", "output", "result", "information", "think"),
]
_SYSTEM = [
    "You are a helpful assistant.",
    "You are a careful assistant. Use the tools when they help, then answer.",
    "Solve the problem. Put the final answer in <answer></answer> tags.",
]


def _num(rng: random.Random) -> int:
    return rng.choice([rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 9999)])


def _english(rng: random.Random) -> str:
    n, noun, adj = _num(rng), rng.choice(_NOUNS), rng.choice(_ADJS)
    forms = [
        f"The {adj} {noun} {rng.choice(_VERBS)} {n} entries.",
        f"Each {noun} has a {adj} key, and the table has {n} rows.",
        f"There are {n} {rng.choice(_ITEMS)} in the {noun}; {rng.choice(_NAMES)} counted them.",
        f"Look up the key '{noun}_{n}' and return its value.",
        f"What is the {adj} value in the {noun} column? It is {n}.",
        f"The answer is {n}, because the {noun} {rng.choice(_VERBS)} it.",
    ]
    return " ".join(rng.choice(forms) for _ in range(rng.randint(1, 4)))


def _word_problem(rng: random.Random) -> str:
    a, b, name = rng.randint(2, 99), rng.randint(2, 99), rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    if rng.random() < 0.5:
        question = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have?"
        work, answer = f"{a} + {b} = {a + b}", a + b
    else:
        x = rng.randint(1, 20)
        question = f"Solve for x: {a}x + {b} = {a * x + b}."
        work, answer = f"{a}x = {a * x + b} - {b} = {a * x}, so x = {a * x} / {a} = {x}", x
    return f"{question}\n<think>\n{work}\n</think>\n<answer>{answer}</answer>"


def _python(rng: random.Random) -> str:
    a, b, var = rng.randint(1, 999), rng.randint(1, 99), rng.choice(["x", "n", "total", "result"])
    bodies = [
        f"{var} = {a} * {b}\nprint({var})",
        f"import math\nprint(math.sqrt({a * a}))",
        f"{var} = sum(range({a}))\nprint({var})",
        f"def f(k):\n    return k ** 2 + {b}\n\nprint([f(i) for i in range({b % 10 + 1})])",
        f"from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - {a}, x))",
        f"values = [{a}, {b}, {a + b}]\nfor v in values:\n    if v % 2 == 0:\n        print(v)",
    ]
    out = str(a * b) if rng.random() < 0.5 else f"[{a}, {b}]"
    return f"<python>\n{rng.choice(bodies)}\n</python>\n<output>\n{out}\n</output>"


def _sql_query(rng: random.Random) -> str:
    table = rng.choice(list(_TABLES))
    cols = _TABLES[table]
    col, other = rng.choice(cols), rng.choice(cols)
    forms = [
        f"SELECT {col}, COUNT(*) FROM {table} GROUP BY {col} "
        f"ORDER BY COUNT(*) DESC LIMIT {_num(rng)};",
        f"SELECT * FROM {table} WHERE {col} = '{rng.choice(_CITIES)}';",
        f"SELECT AVG({other}) FROM {table} WHERE {col} > {_num(rng)};",
        "SELECT c.name, SUM(o.amount) FROM customers c JOIN orders o "
        "ON c.customer_id = o.customer_id GROUP BY c.name;",
        "SELECT f.origin, c.name FROM flights f JOIN carriers c "
        f"ON f.carrier_id = c.carrier_id WHERE f.delay > {_num(rng)};",
    ]
    return rng.choice(forms)


def _sql(rng: random.Random) -> str:
    query = _sql_query(rng)
    rows = "\n".join(f"{rng.choice(_CITIES)} | {_num(rng)}" for _ in range(rng.randint(1, 4)))
    return f"<sql>\n{query}\n</sql>\n<result>\n{rows}\n</result>"


def _tool_call(rng: random.Random) -> str:
    name = rng.choice(["sql", "python", "search", "lookup"])
    if name == "sql":
        arguments = {"query": _sql_query(rng)}
    elif name == "python":
        arguments = {"code": f"print({_num(rng)} + {_num(rng)})"}
    else:
        arguments = {"query": f"{rng.choice(_ADJS)} {rng.choice(_NOUNS)} in {rng.choice(_CITIES)}"}
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _search(rng: random.Random) -> str:
    city, n = rng.choice(_CITIES), _num(rng)
    docs = "\n".join(
        f"Doc {i + 1}(Title: {city} {rng.choice(_NOUNS)}) {city} has {n + i} {rng.choice(_ITEMS)}."
        for i in range(rng.randint(1, 3))
    )
    tag = rng.choice(["search", "lookup"])
    return f"<{tag}>{city} {rng.choice(_NOUNS)}</{tag}>\n<information>\n{docs}\n</information>"


def _prose(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(1, 3)):
        words = rng.choices(_VOCAB, k=rng.randint(4, 14))
        words[0] = words[0].capitalize()
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(_num(rng)))
        sentences.append(" ".join(words) + rng.choice([".", ".", "?", "!", ":", ";"]))
    return " ".join(sentences)


def _code_names(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 5)):
        a, b, c = rng.sample(_IDENTS, 3)
        forms = [
            f"{a} = {b}({c})",
            f"{a}.{b}({c}, {_num(rng)})",
            f"from {a} import {b}, {c}",
            f"    return {a}({b}) + {c}",
            f"for {a} in {b}({c}):",
            f"print({a}[{_num(rng)}])",
        ]
        lines.append(rng.choice(forms))
    return "<python>\n" + "\n".join(lines) + "\n</python>"


def _chat(rng: random.Random) -> str:
    turns = [("system", rng.choice(_SYSTEM)), ("user", _english(rng))]
    turns += [("assistant", rng.choice(_BODIES)(rng)), ("tool", str(_num(rng)))]
    turns += [("assistant", f"<answer>{_num(rng)}</answer>")]
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)


def _tags(rng: random.Random) -> str:
    tag = rng.choice(_TAGS)
    return f"<{tag}>{_english(rng)}</{tag}>"


_BODIES: list[Callable[[random.Random], str]] = [
    _english,
    _word_problem,
    _python,
    _sql,
    _tool_call,
    _search,
    _tags,
    _prose,
    _prose,
    _code_names,
]


def generate_corpus(n_docs: int = 20_000, *, seed: int = 0) -> Iterator[str]:
    """Yield ``n_docs`` generated documents; the same ``seed`` gives the same corpus."""
    rng = random.Random(seed)
    makers = [*_BODIES, _chat, _chat]
    for _ in range(n_docs):
        yield rng.choice(makers)(rng)
