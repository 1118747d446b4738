"""The SWE domain tests' shared setup: the fixture repositories under ``fixtures/`` are
data (each with its own tests, run in a copy by the tests that need them), so this
suite never collects them."""

collect_ignore = ["fixtures"]
