"""VT-Lookup-v0's oracle: look the key up, answer what the tool returned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vt_envs.core.policy import OraclePolicy

__all__ = ["LookupOracle"]


class LookupOracle(OraclePolicy):
    """Looks the key up, then answers exactly what the tool returned."""

    def next_action(self, observation: str, info: Mapping[str, Any]) -> str:
        if self.turn == 0:
            return f"<lookup>{self.task.metadata['key']}</lookup>"
        return f"<answer>{info['message']['content'].strip()}</answer>"
