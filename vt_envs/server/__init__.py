"""Env tools over HTTP: ``vt-tool-server`` (:mod:`~vt_envs.server.app`,
:mod:`~vt_envs.server.cli`) and ``gym.make(id, tool_server=URL)``
(:mod:`~vt_envs.server.client`); the wire format is :mod:`~vt_envs.server.protocol`."""
