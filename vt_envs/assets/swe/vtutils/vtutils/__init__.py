"""vtutils: small utilities (intervals, text, statistics, containers).

VT-SWE-v0's built-in repository: a real, tested pure-Python package that its
task builder mutates, one bug per task.
"""

__version__ = "1.0.0"
