"""The embedded task source of VT-Math-v0: seeded arithmetic, algebra and word problems.

Every problem is written by this module (no dataset, no licence question) from
a random stream keyed by ``(split, index, attempt)``, so the same index gives
the same task on every machine. Each family is chosen so that running code
genuinely helps: products of big numbers, modular powers, sums over long
ranges, exact fraction arithmetic, linear systems, prime counts — and
(issue 31) multi-step word problems, proofs by computation over a range and
competition-style counting, whose exact integer answers need a program.
New families are appended to :data:`FAMILIES`, so an explicit ``families``
list draws the same tasks as before; the default mix draws from all.

Answers are exact strings the math verifier accepts: integers (``"1234"``),
reduced fractions (``"3/7"``, with a leading ``-`` when negative), or
terminating decimals (``"12.5"``).

Each task also carries ``assets["solution_code"]``: standard-library Python
that prints the answer. It is privileged (for :class:`MathOracle` only): the
env never shows assets to the agent, and ``Task.metadata`` (which ``info``
may expose) holds only the family, the difficulty and the source.

Train and test are disjoint by construction: a problem belongs to the test
split iff the SHA-256 of its prompt falls in a fixed 1/8 of the hash space;
each split redraws (``attempt + 1``) until its problem falls on its side.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import comb, gcd

import numpy as np

from vt_envs.core.task import SPLITS, GeneratedTasks, Task
from vt_envs.errors import InvalidConfigError

__all__ = [
    "DIFFICULTIES",
    "FAMILIES",
    "Problem",
    "format_exact",
    "format_fraction",
    "generate_problem",
    "math_tasks",
]

DIFFICULTIES = (1, 2, 3)
DEFAULT_SIZES = {"train": 10_000, "test": 500}
_SPLIT_STREAM = {"train": 0, "test": 1}
_TEST_BUCKETS = 8  # one hash bucket in eight is the test split


@dataclass(frozen=True)
class Problem:
    """One generated problem: the prompt, its exact answer, and code that computes it."""

    family: str
    difficulty: int
    prompt: str
    answer: str
    solution_code: str


def format_exact(value: Fraction | int) -> str:
    """Write an exact rational the way answers are given: ``"12"``, ``"12.5"`` or ``"3/7"``.

    A decimal is used only when it terminates within 6 places (so it is exact).
    """
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    scaled = value * 10**6
    if scaled.denominator == 1:
        sign = "-" if value < 0 else ""
        whole, frac = divmod(abs(scaled.numerator), 10**6)
        return f"{sign}{whole}.{frac:06d}".rstrip("0")
    return f"{value.numerator}/{value.denominator}"


def format_fraction(value: Fraction | int) -> str:
    """Write an exact rational as ``"12"`` or ``"-3/7"`` (never a decimal)."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


# What solution code prints, mirroring format_fraction / format_exact.
_PRINT_FRACTION = "print(v.numerator if v.denominator == 1 else f'{v.numerator}/{v.denominator}')"
_PRINT_EXACT = (
    "s = v * 10**6\n"
    "if v.denominator == 1:\n    print(v.numerator)\n"
    "elif s.denominator == 1:\n"
    "    w, f = divmod(abs(s.numerator), 10**6)\n"
    "    print(('-' if v < 0 else '') + f'{w}.{f:06d}'.rstrip('0'))\n"
    "else:\n    print(f'{v.numerator}/{v.denominator}')"
)

# Each family: (rng, difficulty) -> Problem. Sizes grow with difficulty so
# that level 1 is doable by hand and level 3 really needs the interpreter.


def _int(rng: np.random.Generator, digits: int) -> int:
    return int(rng.integers(10 ** (digits - 1), 10**digits))


def _big_product(rng: np.random.Generator, d: int) -> Problem:
    digits = (3, 6, 11)[d - 1]
    n = 2 + (d == 3)
    factors = [_int(rng, digits) for _ in range(n)]
    shown = " \u00d7 ".join(f"{f:,}" for f in factors)
    value = 1
    for f in factors:
        value *= f
    code = f"print({' * '.join(map(str, factors))})"
    return Problem("big_product", d, f"Compute {shown}.", str(value), code)


def _modpow(rng: np.random.Generator, d: int) -> Problem:
    base = int(rng.integers(2, (20, 1000, 10**6)[d - 1]))
    exp = int(rng.integers(10, (100, 10**5, 10**12)[d - 1]))
    mod = int(rng.integers(7, (100, 10**5, 10**9)[d - 1]))
    prompt = f"What is the remainder when {base}^{{{exp}}} is divided by {mod}?"
    code = f"print(pow({base}, {exp}, {mod}))"
    return Problem("modpow", d, prompt, str(pow(base, exp, mod)), code)


def _range_sum(rng: np.random.Generator, d: int) -> Problem:
    n = int(rng.integers(*((20, 100), (1000, 10**5), (10**5, 10**6))[d - 1]))
    a, b = (int(x) for x in rng.choice(np.arange(2, 14), size=2, replace=False))
    value = _squares_of_multiples(n, a) + _squares_of_multiples(n, b)
    value -= _squares_of_multiples(n, a * b // gcd(a, b))
    prompt = (
        f"Find the sum of k^2 over all integers k from 1 to {n} "
        f"that are divisible by {a} or by {b}."
    )
    code = f"print(sum(k * k for k in range(1, {n} + 1) if k % {a} == 0 or k % {b} == 0))"
    return Problem("range_sum", d, prompt, str(value), code)


def _squares_of_multiples(n: int, a: int) -> int:
    """Sum of k^2 over the multiples k of a in [1, n], in closed form."""
    m = n // a
    return a * a * m * (m + 1) * (2 * m + 1) // 6


def _fraction_sum(rng: np.random.Generator, d: int) -> Problem:
    n = (3, 5, 8)[d - 1]
    top = (10, 30, 100)[d - 1]
    terms = [(int(rng.integers(1, top)), int(rng.integers(2, top))) for _ in range(n)]
    signs = [1] + [int(s) for s in rng.choice([-1, 1], size=n - 1)]
    value = sum(s * Fraction(p, q) for s, (p, q) in zip(signs, terms))
    shown = "".join(
        ("" if i == 0 else (" + " if s > 0 else " - ")) + f"{p}/{q}"
        for i, (s, (p, q)) in enumerate(zip(signs, terms))
    )
    expr = " + ".join(f"({s}) * Fraction({p}, {q})" for s, (p, q) in zip(signs, terms))
    code = f"from fractions import Fraction\nv = {expr}\n" + _PRINT_FRACTION
    prompt = f"Compute {shown}. Give the result as a fraction in lowest terms."
    return Problem("fraction_sum", d, prompt, format_fraction(value), code)


def _percent_chain(rng: np.random.Generator, d: int) -> Problem:
    price = int(rng.integers(20, (200, 5000, 100_000)[d - 1]))
    steps = [int(rng.integers(5, 60)) * int(rng.choice([-1, 1])) for _ in range((2, 3, 5)[d - 1])]
    value = Fraction(price)
    for p in steps:
        value *= Fraction(100 + p, 100)
    words = ", then ".join(f"{'raised' if p > 0 else 'lowered'} by {abs(p)}%" for p in steps)
    prompt = (
        f"An item costs ${price}. Its price is {words}. What is the final price in dollars? "
        "Give the exact value."
    )
    factors = " * ".join(f"Fraction({100 + p}, 100)" for p in steps)
    code = f"from fractions import Fraction\nv = {price} * {factors}\n" + _PRINT_EXACT
    return Problem("percent_chain", d, prompt, format_exact(value), code)


def _linear_system(rng: np.random.Generator, d: int) -> Problem:
    n = (2, 3, 4)[d - 1]
    span = (9, 20, 50)[d - 1]
    names = "xyzw"[:n]
    while True:
        a = rng.integers(-span, span + 1, size=(n, n))
        if round(abs(np.linalg.det(a))) >= 1:
            break
    rhs = rng.integers(-span * 3, span * 3 + 1, size=n)
    sol = _solve_exact([[int(v) for v in row] for row in a], [int(v) for v in rhs])
    weights = [int(w) for w in rng.integers(1, 4, size=n)]
    target = sum(w * s for w, s in zip(weights, sol))
    eqs = "; ".join(_equation(row, names) + f" = {int(c)}" for row, c in zip(a, rhs))
    ask = " + ".join(f"{w}{v}" if w != 1 else v for w, v in zip(weights, names))
    prompt = f"Solve the system {eqs}. What is {ask}? Give an exact value."
    code = (
        "from fractions import Fraction\n"
        f"a = {[[int(v) for v in row] for row in a]}\nb = {[int(v) for v in rhs]}\n"
        f"n = {n}\n"
        "m = [[Fraction(v) for v in row] + [Fraction(c)] for row, c in zip(a, b)]\n"
        "for i in range(n):\n"
        "    p = next(r for r in range(i, n) if m[r][i] != 0)\n"
        "    m[i], m[p] = m[p], m[i]\n"
        "    for r in range(n):\n"
        "        if r != i:\n"
        "            f = m[r][i] / m[i][i]\n"
        "            m[r] = [x - f * y for x, y in zip(m[r], m[i])]\n"
        "sol = [m[i][n] / m[i][i] for i in range(n)]\n"
        f"v = sum(w * s for w, s in zip({weights}, sol))\n" + _PRINT_FRACTION
    )
    return Problem("linear_system", d, prompt, format_fraction(target), code)


def _equation(row: Sequence[int], names: str) -> str:
    """``[3, -1]``, ``"xy"`` → ``"3x - y"``."""
    terms: list[str] = []
    for coef, name in zip(row, names):
        coef = int(coef)
        if coef == 0:
            continue
        mag = "" if abs(coef) == 1 else str(abs(coef))
        if terms:
            terms.append(("- " if coef < 0 else "+ ") + mag + name)
        else:
            terms.append(("-" if coef < 0 else "") + mag + name)
    return " ".join(terms) or "0"


def _solve_exact(a: list[list[int]], b: list[int]) -> list[Fraction]:
    n = len(a)
    m = [[Fraction(v) for v in row] + [Fraction(c)] for row, c in zip(a, b)]
    for i in range(n):
        p = next(r for r in range(i, n) if m[r][i] != 0)
        m[i], m[p] = m[p], m[i]
        for r in range(n):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [x - f * y for x, y in zip(m[r], m[i])]
    return [m[i][n] / m[i][i] for i in range(n)]


def _mod_inverse(rng: np.random.Generator, d: int) -> Problem:
    primes = (97, 10007, 1_000_000_007)
    m = primes[d - 1]
    a = int(rng.integers(2, m - 1))
    b = int(rng.integers(1, m))
    x = b * pow(a, -1, m) % m or m
    prompt = f"Find the smallest positive integer x such that {a}x \u2261 {b} (mod {m})."
    code = f"m = {m}\nx = {b} * pow({a}, -1, m) % m\nprint(x or m)"
    return Problem("mod_inverse", d, prompt, str(x), code)


def _prime_count(rng: np.random.Generator, d: int) -> Problem:
    lo = int(rng.integers(1, (50, 10_000, 1_000_000)[d - 1]))
    hi = lo + int(rng.integers(*((30, 200), (1000, 20_000), (100_000, 400_000))[d - 1]))
    value = _count_primes(lo, hi)
    prompt = f"How many prime numbers p satisfy {lo} \u2264 p \u2264 {hi}?"
    code = (
        f"lo, hi = {lo}, {hi}\n"
        "sieve = bytearray([1]) * (hi + 1)\n"
        "sieve[0:2] = b'\\x00\\x00'\n"
        "for i in range(2, int(hi ** 0.5) + 1):\n"
        "    if sieve[i]:\n"
        "        sieve[i * i :: i] = bytearray(len(range(i * i, hi + 1, i)))\n"
        "print(sum(sieve[lo : hi + 1]))"
    )
    return Problem("prime_count", d, prompt, str(value), code)


def _count_primes(lo: int, hi: int) -> int:
    sieve = bytearray([1]) * (hi + 1)
    sieve[0:2] = b"\x00\x00"
    for i in range(2, int(hi**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, hi + 1, i)))
    return sum(sieve[lo : hi + 1])


def _digit_sum(rng: np.random.Generator, d: int) -> Problem:
    base = int(rng.integers(2, (30, 50, 1000)[d - 1]))
    exp = int(rng.integers(*((5, 25), (50, 300), (300, 1300))[d - 1]))  # < 4300 digits
    value = sum(int(c) for c in str(base**exp))
    prompt = f"What is the sum of the decimal digits of {base}^{{{exp}}}?"
    code = f"print(sum(int(c) for c in str({base} ** {exp})))"
    return Problem("digit_sum", d, prompt, str(value), code)


def _word_production(rng: np.random.Generator, d: int) -> Problem:
    """A multi-step word problem: production, a percentage increase, packing."""
    rate = int(rng.integers(*((20, 100), (100, 5000), (5000, 200_000))[d - 1]))
    days1, days2 = (int(x) for x in rng.integers(3, (10, 60, 365)[d - 1], size=2))
    pct = int(rng.choice([10, 20, 25, 40, 50, 60, 75]))
    box = int(rng.integers(6, (13, 50, 144)[d - 1]))
    total = rate * days1 + (rate * (100 + pct) // 100) * days2
    value = total // box
    prompt = (
        f"A factory makes {rate:,} widgets per day for {days1} days. It then raises its "
        f"daily output by {pct}% (rounded down to a whole number of widgets) for another "
        f"{days2} days. All widgets are packed into boxes of {box}. "
        "How many full boxes can be packed?"
    )
    code = (
        f"rate = {rate}\ntotal = rate * {days1} + (rate * {100 + pct} // 100) * {days2}\n"
        f"print(total // {box})"
    )
    return Problem("word_production", d, prompt, str(value), code)


def _binomial_mod(rng: np.random.Generator, d: int) -> Problem:
    n = int(rng.integers(*((6, 120), (50, 500), (1000, 5000))[d - 1]))  # d1: 6-40 before issue 31
    k = int(rng.integers(2, n - 1))
    mod = (1000, 10**6, 10**9 + 7)[d - 1]
    prompt = f"What is C({n}, {k}) (the binomial coefficient) modulo {mod}?"
    code = f"from math import comb\nprint(comb({n}, {k}) % {mod})"
    return Problem("binomial_mod", d, prompt, str(comb(n, k) % mod), code)


def _lcm_range(rng: np.random.Generator, d: int) -> Problem:
    lo = int(rng.integers(2, (200, 400, 200)[d - 1]))  # d1, d2 widened in issue 31 (repeats)
    hi = lo + int(rng.integers(*((2, 7), (15, 40), (60, 150))[d - 1]))
    mod = (None, None, 10**9 + 7)[d - 1]
    value = 1
    for k in range(lo, hi + 1):
        value = value * k // gcd(value, k)
    ask = f"the least common multiple of all integers from {lo} to {hi}"
    prompt = f"What is {ask}, modulo {mod}?" if mod else f"What is {ask}?"
    code = (
        "from math import lcm\nv = 1\n"
        f"for k in range({lo}, {hi} + 1):\n    v = lcm(v, k)\n"
        f"print(v{f' % {mod}' if mod else ''})"
    )
    return Problem("lcm_range", d, prompt, str(value % mod if mod else value), code)


# Harder families (issue 31): multi-step word problems, proofs by computation over a
# range, and competition-style counting. Each answer is an exact integer that code
# computes in well under a second and a closed-book guess almost never hits.


def _word_inventory(rng: np.random.Generator, d: int) -> Problem:
    """Several computations in a row: ship a share, round down, restock, repeat."""
    stock = int(rng.integers(*((200, 2000), (2000, 50_000), (50_000, 2_000_000))[d - 1]))
    pct = int(rng.integers(5, 40))
    delivery = int(rng.integers(*((20, 300), (300, 8000), (8000, 300_000))[d - 1]))
    months = int(rng.integers(*((3, 7), (8, 25), (24, 121))[d - 1]))
    value = stock
    for _ in range(months):
        value = value - value * pct // 100 + delivery
    prompt = (
        f"A warehouse holds {stock:,} crates at the start of the year. Each month it first "
        f"ships out {pct}% of the crates it holds (rounded down to whole crates), then "
        f"receives a delivery of {delivery:,} crates. How many crates does it hold after "
        f"{months} months?"
    )
    code = (
        f"v = {stock}\nfor _ in range({months}):\n"
        f"    v = v - v * {pct} // 100 + {delivery}\nprint(v)"
    )
    return Problem("word_inventory", d, prompt, str(value), code)


def _word_savings(rng: np.random.Generator, d: int) -> Problem:
    """Two savings plans: find the first week one overtakes the other, then its total."""
    a0 = int(rng.integers(0, (50, 2000, 100_000)[d - 1]))
    b0 = a0 + int(rng.integers(0, (100, 5000, 500_000)[d - 1]))
    a = int(rng.integers(5, (40, 300, 5000)[d - 1]))
    b = a + int(rng.integers(1, (30, 500, 20_000)[d - 1]))
    step = int(rng.integers(1, (6, 20, 60)[d - 1]))
    week, ana, ben = 0, a0, b0
    while ana <= ben:
        week += 1
        ana, ben = ana + a + step * (week - 1), ben + b
    prompt = (
        f"Ana has ${a0:,} saved and Ben has ${b0:,}. Every week Ben adds ${b:,}. Ana adds "
        f"${a:,} in the first week and ${step} more each week than the week before. At the end "
        "of the first week in which Ana's savings exceed Ben's, how many dollars has Ana saved?"
    )
    code = (
        f"week, ana, ben = 0, {a0}, {b0}\nwhile ana <= ben:\n    week += 1\n"
        f"    ana, ben = ana + {a} + {step} * (week - 1), ben + {b}\nprint(ana)"
    )
    return Problem("word_savings", d, prompt, str(ana), code)


_SIEVE = (
    "def sieve(n):\n    s = bytearray([1]) * (n + 1)\n    s[0:2] = b'\\x00\\x00'\n"
    "    for i in range(2, int(n ** 0.5) + 1):\n        if s[i]:\n"
    "            s[i * i :: i] = bytearray(len(range(i * i, n + 1, i)))\n    return s\n"
)
_COLLATZ = (
    "def steps(n, memo={1: 0}):\n    path = []\n    while n not in memo:\n"
    "        path.append(n)\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
    "    for m in reversed(path):\n        memo[m] = memo[n] + 1\n        n = m\n"
    "    return memo[n]\n"
)
_TWO_SQUARES = (
    "import math\n"
    "def two_squares(lo, hi):\n    hit = set()\n    a = 0\n    while 2 * a * a <= hi:\n"
    "        b = max(a, math.isqrt(max(lo - a * a, 0)))\n        while a * a + b * b <= hi:\n"
    "            if a * a + b * b >= lo:\n                hit.add(a * a + b * b)\n"
    "            b += 1\n        a += 1\n    return len(hit)\n"
)


def _run_helper(source: str, call: str) -> int:
    """Evaluate one of the helper sources above (shared by the gold and the solution)."""
    scope: dict[str, object] = {}
    exec(source, scope)  # our own source text, never the agent's
    return int(eval(call, scope))


def _property_check(rng: np.random.Generator, d: int) -> Problem:
    """Proof by computation: check a property at every point of a range; report a statistic."""
    kind = int(rng.integers(3))
    if kind == 0:
        hi = int(rng.integers(*((40, 400), (500, 5000), (5000, 20_000))[d - 1])) * 2
        lo = max(4, hi - 2 * int(rng.integers(*((5, 15), (20, 80), (30, 100))[d - 1])))
        call = (
            f"sum(1 for m in range({lo}, {hi} + 1, 2) "
            "for p in range(2, m // 2 + 1) if s[p] and s[m - p])"
        )
        source = _SIEVE + f"s = sieve({hi})\n"
        prompt = (
            "Goldbach's conjecture says every even number greater than 2 is a sum of two "
            f"primes. Check it for every even m with {lo} \u2264 m \u2264 {hi}: count, for each m, "
            "the ways to write m = p + q with primes p \u2264 q. What is the total of these "
            "counts over the range?"
        )
    elif kind == 1:
        lo = int(rng.integers(2, (1000, 10_000, 1_000_000)[d - 1]))
        hi = lo + int(rng.integers(*((10, 30), (100, 500), (300, 1000))[d - 1]))
        call = f"min(range({lo}, {hi} + 1), key=lambda n: (-steps(n), n))"
        source = _COLLATZ
        prompt = (
            "The Collatz map sends n to n/2 if n is even and to 3n + 1 if n is odd. Verify that "
            f"every starting value from {lo} to {hi} reaches 1, and find the starting value in "
            "that range that takes the most steps to get there (the smallest one if several tie)."
        )
    else:
        lo = int(rng.integers(1, (2000, 100_000, 10**9)[d - 1]))
        hi = lo + int(rng.integers(*((20, 60), (200, 1000), (1000, 5000))[d - 1]))
        call = f"two_squares({lo}, {hi})"
        source = _TWO_SQUARES
        prompt = (
            f"Check every integer n with {lo} \u2264 n \u2264 {hi}: can it be written as a^2 + b^2 "
            "with integers a, b \u2265 0? How many of them can?"
        )
    value = _run_helper(source, call)
    return Problem("property_check", d, prompt, str(value), f"{source}print({call})")


def _factored(rng: np.random.Generator, d: int) -> dict[int, int]:
    """A random integer as ``{prime: exponent}``, at most 10^4, 10^6 or 10^12."""
    primes = [p for p in range(2, 200) if all(p % q for q in range(2, int(p**0.5) + 1))]
    limit, value, factors = (10**4, 10**6, 10**12)[d - 1], 1, {}
    for p in rng.choice(primes[: (12, 20, 46)[d - 1]], size=(3, 5, 8)[d - 1], replace=False):
        e = int(rng.integers(1, (4, 5, 6)[d - 1]))
        while e and value * int(p) ** e > limit:
            e -= 1
        if e:
            factors[int(p)], value = e, value * int(p) ** e
    return factors


_FACTOR = (
    "def factor(n):\n    f, p = {}, 2\n    while p * p <= n:\n        while n % p == 0:\n"
    "            f[p] = f.get(p, 0) + 1\n            n //= p\n        p += 1\n"
    "    if n > 1:\n        f[n] = f.get(n, 0) + 1\n    return f\n"
)
_DIGIT_COUNT = (
    "from functools import lru_cache\n"
    "def count(n, s):\n    digits = list(map(int, str(n)))\n    @lru_cache(None)\n"
    "    def go(i, left, tight):\n        if left < 0:\n            return 0\n"
    "        if i == len(digits):\n            return int(left == 0)\n"
    "        top = digits[i] if tight else 9\n"
    "        return sum(go(i + 1, left - x, tight and x == top) for x in range(top + 1))\n"
    "    return go(0, s, True)\n"
)


def _number_theory(rng: np.random.Generator, d: int) -> Problem:
    """Competition-style number theory with an exact integer answer."""
    kind = int(rng.integers(3))
    if kind == 0:
        factors = _factored(rng, d)
        m = math.prod(p**e for p, e in factors.items())
        prompt = f"How many ordered pairs (a, b) of positive integers satisfy lcm(a, b) = {m}?"
        call = f"math.prod(2 * e + 1 for e in factor({m}).values())"
    elif kind == 1:
        factors = _factored(rng, max(1, d - 1))
        m = math.prod(p**e for p, e in factors.items())
        n = int(rng.integers(*((50, 1000), (10**4, 10**7), (10**9, 10**15))[d - 1]))
        prompt = f"How many integers n with 1 \u2264 n \u2264 {n} are coprime to {m}?"
        call = (
            f"sum((-1) ** r * ({n} // math.prod(c)) for r in range(len(factor({m})) + 1) "
            f"for c in itertools.combinations(factor({m}), r))"
        )
    else:
        n = int(rng.integers(*((100, 1000), (10**5, 10**7), (10**12, 10**16))[d - 1]))
        s = int(rng.integers(2, (15, 30, 60)[d - 1]))
        prompt = (
            f"How many integers n with 1 \u2264 n \u2264 {n} have decimal digits summing to {s}?"
        )
        call = f"count({n}, {s})"
    source = "import itertools, math\n" + _FACTOR + (_DIGIT_COUNT if kind == 2 else "")
    value = _run_helper(source, call)
    return Problem("number_theory", d, prompt, str(value), f"{source}print({call})")


def _combinatorics(rng: np.random.Generator, d: int) -> Problem:
    """Counting that a DP does exactly: change-making, subset sums, blocked lattice paths."""
    kind = int(rng.integers(3))
    if kind == 0:
        pool = np.arange(1, (12, 40, 60)[d - 1])  # small coins: many ways, no guessable 0 or 1
        coins = sorted(int(c) for c in rng.choice(pool, size=(3, 4, 6)[d - 1], replace=False))
        total = int(rng.integers(*((30, 120), (300, 2000), (5000, 30_000))[d - 1]))
        prompt = (
            f"In how many ways can exactly {total} cents be paid with coins worth "
            f"{', '.join(map(str, coins))} cents (any number of each coin; the order of the "
            "coins does not matter)?"
        )
        body = (
            f"w = [1] + [0] * {total}\nfor c in {coins}:\n"
            f"    for v in range(c, {total} + 1):\n        w[v] += w[v - c]\n"
        )
        expr = f"w[{total}]"
    elif kind == 1:
        size = (6, 14, 40)[d - 1]
        items = [int(x) for x in rng.integers(1, (30, 200, 10_000)[d - 1], size=size)]
        k = int(rng.integers(3, (10, 30, 200)[d - 1]))
        prompt = (
            f"How many subsets of the list [{', '.join(map(str, items))}] have a sum divisible "
            f"by {k}? (Positions are distinct, so equal numbers count separately; the empty "
            "subset counts.)"
        )
        body = (
            f"w = [1] + [0] * {k - 1}\nfor x in {items}:\n"
            f"    w = [w[r] + w[(r - x) % {k}] for r in range({k})]\n"
        )
        expr = "w[0]"
    else:
        a, b = (int(x) for x in rng.integers(*((3, 13), (10, 40), (40, 150))[d - 1], size=2))
        blocked = sorted({(int(rng.integers(1, a)), int(rng.integers(1, b))) for _ in range(d)})
        prompt = (
            f"A path goes from (0, 0) to ({a}, {b}) in unit steps, each step right (+1 in x) or "
            f"up (+1 in y). How many such paths never pass through "
            f"{' or '.join(f'({x}, {y})' for x, y in blocked)}?"
        )
        body = (
            f"blocked = {blocked}\nw = [[0] * {b + 1} for _ in range({a + 1})]\nw[0][0] = 1\n"
            f"for x in range({a + 1}):\n    for y in range({b + 1}):\n"
            "        if (x, y) in blocked:\n            w[x][y] = 0\n"
            "        elif x or y:\n"
            "            w[x][y] = (w[x - 1][y] if x else 0) + (w[x][y - 1] if y else 0)\n"
        )
        expr = f"w[{a}][{b}]"
    return Problem("combinatorics", d, prompt, str(_run_helper(body, expr)), f"{body}print({expr})")


FAMILIES: dict[str, Callable[[np.random.Generator, int], Problem]] = {
    "big_product": _big_product,
    "modpow": _modpow,
    "range_sum": _range_sum,
    "fraction_sum": _fraction_sum,
    "percent_chain": _percent_chain,
    "linear_system": _linear_system,
    "mod_inverse": _mod_inverse,
    "prime_count": _prime_count,
    "digit_sum": _digit_sum,
    "word_production": _word_production,
    "binomial_mod": _binomial_mod,
    "lcm_range": _lcm_range,
    # issue 31's harder families (appended: explicit family lists draw as before)
    "word_inventory": _word_inventory,
    "word_savings": _word_savings,
    "property_check": _property_check,
    "number_theory": _number_theory,
    "combinatorics": _combinatorics,
}
"""Problem families by name; each maps ``(rng, difficulty)`` to a :class:`Problem`."""


def _is_test(prompt: str) -> bool:
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return digest[0] % _TEST_BUCKETS == 0


def generate_problem(
    split: str,
    index: int,
    *,
    families: Sequence[str] | None = None,
    difficulties: Sequence[int] = DIFFICULTIES,
) -> Problem:
    """The problem at ``index`` of ``split``: a pure function of its arguments.

    The family and difficulty are drawn from the same seeded stream as the
    numbers; the draw is repeated until the prompt hashes into ``split``'s
    side, so no prompt is in both splits.
    """
    names = _check_families(families)
    levels = _check_difficulties(difficulties)
    want_test = split == "test"
    for attempt in range(10_000):
        rng = np.random.default_rng([_SPLIT_STREAM[split], index, attempt])
        family = names[int(rng.integers(len(names)))]
        level = levels[int(rng.integers(len(levels)))]
        problem = FAMILIES[family](rng, level)
        if _is_test(problem.prompt) == want_test:
            return problem
    raise RuntimeError(f"no {split} problem found for index {index}")  # pragma: no cover


def _check_families(families: Sequence[str] | None) -> list[str]:
    if families is None:
        return list(FAMILIES)
    if isinstance(families, str):
        families = [families]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise InvalidConfigError(
            f"families must be a non-empty list of {sorted(FAMILIES)}, got {list(families)!r}"
        )
    return list(families)


def _check_difficulties(difficulties: Sequence[int] | int) -> list[int]:
    if isinstance(difficulties, int):
        difficulties = [difficulties]
    levels = list(difficulties)
    if not levels or any(level not in DIFFICULTIES for level in levels):
        raise InvalidConfigError(
            f"difficulty must be one or more of {DIFFICULTIES}, got {difficulties!r}"
        )
    return levels


def math_tasks(
    split: str = "train",
    *,
    size: int | None = None,
    families: Sequence[str] | None = None,
    difficulty: Sequence[int] | int = DIFFICULTIES,
) -> GeneratedTasks:
    """The embedded, seeded task source of VT-Math-v0 (train: 10,000 tasks; test: 500).

    Task ids are ``"math/{split}/{index}"``; with non-default ``families`` or
    ``difficulty`` the id gains a suffix naming them, so ids stay unique
    across configurations. ``metadata`` holds ``family``, ``difficulty``
    (1 easy … 3 hard) and ``source="generated"``.
    """
    if split not in SPLITS:
        raise InvalidConfigError(f"split must be one of {SPLITS}, got {split!r}")
    names = _check_families(families)
    levels = _check_difficulties(difficulty)
    suffix = ""
    if names != list(FAMILIES):
        suffix += "/" + "+".join(names)
    if levels != list(DIFFICULTIES):
        suffix += "/d" + "".join(map(str, levels))

    def generate(split: str, index: int) -> Task:
        problem = generate_problem(split, index, families=names, difficulties=levels)
        return Task(
            id=f"math/{split}/{index}{suffix}",
            prompt=problem.prompt,
            gold=problem.answer,
            metadata={
                "family": problem.family,
                "difficulty": problem.difficulty,
                "source": "generated",
            },
            assets={"solution_code": problem.solution_code},
        )

    return GeneratedTasks(generate, size or DEFAULT_SIZES[split], name="math", split=split)
