"""VT-SWE-v0's building blocks (the env id is not registered yet): repository tasks
made SWE-smith style by :mod:`~vt_envs.domains.swe.mutations` (one AST mutation of a
working repository, kept when its tests catch it, with an issue text that does not
reveal the fix), and the episode around them — :mod:`~vt_envs.domains.swe.env`,
:mod:`~vt_envs.domains.swe.tools`, :mod:`~vt_envs.domains.swe.editor`,
:mod:`~vt_envs.domains.swe.files`, :mod:`~vt_envs.domains.swe.workspace`,
:mod:`~vt_envs.domains.swe.evaluation` and :mod:`~vt_envs.domains.swe.verifier`.
"""
