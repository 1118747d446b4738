"""Built-in tools. Each registers lazily, so importing this package is cheap."""

from vt_envs.core.tool import tool_registry

tool_registry.register("python", "vt_envs.tools.python:PythonTool")
tool_registry.register("bash", "vt_envs.tools.bash:BashTool")
