"""Remote tools: the client side of a tool server.

``gym.make(id, tool_server=URL)`` swaps an env's tools for
:class:`~vt_envs.tools.remote.client.RemoteTool` s (:mod:`~vt_envs.tools.remote.client`);
what travels over HTTP is :mod:`~vt_envs.tools.remote.protocol`. The server
itself (``vt-tool-server``) is :mod:`vt_envs.server`, a layer above.
"""
