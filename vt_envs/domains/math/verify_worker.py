"""The math-verify worker process: ``python -m vt_envs.domains.math.verify_worker``.

Why a process: math-verify (through sympy) can take unbounded time or memory
on adversarial answers (``9^9^9^9``), and its own timeout uses
``signal.alarm``, which only works on the main thread, while VT calls
verifiers from its event-loop thread. A separate process can be killed at a
deadline from any thread; the parent restarts it on the next call.

Protocol (one JSON object per line each way):
``{"gold": str, "answer": str, "float_rounding": int}`` →
``{"equal": bool}`` or ``{"error": "..."}``.

The worker parses text only (math-verify's regexes admit digits and
operators before sympy's ``parse_expr`` sees them); it limits its own
address space so a huge expression fails inside it instead of exhausting
the machine.
"""

from __future__ import annotations

import json
import logging
import sys

_ADDRESS_SPACE_BYTES = 4 << 30


def _limit_memory() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE_BYTES, _ADDRESS_SPACE_BYTES))
    except (ImportError, ValueError, OSError):  # pragma: no cover - non-POSIX or locked limits
        pass


def _parse(text: str) -> list:
    from math_verify import parse

    # Bare answers ("1/2", "\frac{1}{2}", "[1,2)") parse best as LaTeX math;
    # text already holding delimiters or \boxed is parsed as given.
    wrapped = text if ("$" in text or "\\boxed" in text) else f"${text}$"
    for candidate in (wrapped, text):
        parsed = parse(candidate, parsing_timeout=None)
        if parsed:
            return parsed
    return []


def equal(gold: str, answer: str, float_rounding: int = 6) -> bool:
    """math-verify's verdict on ``answer`` against ``gold`` (no timeout: the caller bounds it)."""
    from math_verify import verify

    parsed_gold, parsed_answer = _parse(gold), _parse(answer)
    if not parsed_gold or not parsed_answer:
        return False
    return bool(
        verify(parsed_gold, parsed_answer, float_rounding=float_rounding, timeout_seconds=None)
    )


def main() -> None:
    _limit_memory()
    sys.set_int_max_str_digits(100_000)
    # math-verify warns once that its timeout is off: we bound it from outside.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (import before the first request: the parent's deadline is per call)

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = {
                "equal": equal(
                    str(request["gold"]),
                    str(request["answer"]),
                    int(request.get("float_rounding", 6)),
                )
            }
        except Exception as exc:  # any failure is a verdict of "not equal"
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
