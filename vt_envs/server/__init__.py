"""Env tools over HTTP: ``vt-tool-server`` (:mod:`~vt_envs.server.app`,
:mod:`~vt_envs.server.cli`). Its client, ``gym.make(id, tool_server=URL)``, and the
wire format live with the tools (:mod:`vt_envs.tools.remote`); ``vt_envs.server.client``
and ``vt_envs.server.protocol`` re-export them."""
