"""The worked examples of VT-SQL-v0: two questions on a five-row ``library`` database.

The database is not one the env serves (a demonstration must not answer a
task), so its schema is in the example's question, written the way a task
prompt writes one. :data:`LIBRARY_SQL` builds it; ``tests/domains/sql``
runs each example call on it and checks the output is what the sql tool
shows.
"""

from __future__ import annotations

from vt_envs.core.examples import ExampleCall, WorkedExample

__all__ = ["EXAMPLES", "LIBRARY_SQL"]

LIBRARY_SQL = """
CREATE TABLE books (book_id INTEGER PRIMARY KEY, title VARCHAR, author VARCHAR, year INTEGER);
INSERT INTO books VALUES
  (1, 'The Left Hand of Darkness', 'Ursula K. Le Guin', 1969),
  (2, 'The Dispossessed', 'Ursula K. Le Guin', 1974),
  (3, 'A Wizard of Earthsea', 'Ursula K. Le Guin', 1968),
  (4, 'Beloved', 'Toni Morrison', 1987),
  (5, 'Invisible Cities', 'Italo Calvino', 1972);
"""

_SCHEMA = """Database `library`: a small lending library.

Schema:
CREATE TABLE books (
  book_id INTEGER,
  title VARCHAR,
  author VARCHAR,
  year INTEGER,
  PRIMARY KEY (book_id)
);
-- 5 rows; sample rows:
-- book_id | title | author | year
-- 1 | The Left Hand of Darkness | Ursula K. Le Guin | 1969
-- 2 | The Dispossessed | Ursula K. Le Guin | 1974
-- 3 | A Wizard of Earthsea | Ursula K. Le Guin | 1968

Question: """

_TOP_AUTHORS = "SELECT author, COUNT(*) AS n FROM books GROUP BY author ORDER BY n DESC, author"
_TOP_AUTHOR = "SELECT author, COUNT(*) AS n FROM books GROUP BY author ORDER BY n DESC LIMIT 1"
_BEFORE_1970 = "SELECT COUNT(*) AS n FROM books WHERE year < 1970"

EXAMPLES = (
    WorkedExample(
        _SCHEMA + "Which author wrote the most books? Give the author and the number of books.",
        (
            ExampleCall(
                "sql",
                {"query": _TOP_AUTHORS},
                "author | n\nUrsula K. Le Guin | 3\nItalo Calvino | 1\nToni Morrison | 1\n(3 rows)",
            ),
        ),
        _TOP_AUTHOR,
    ),
    WorkedExample(
        _SCHEMA + "How many books were published before 1970?",
        (ExampleCall("sql", {"query": _BEFORE_1970}, "n\n2\n(1 row)"),),
        _BEFORE_1970,
    ),
)
"""Explore with one query, then answer with the query whose result answers the question."""
