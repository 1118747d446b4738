"""An action as :class:`~vt_envs.core.env.ToolEnv` reads it: the text the policy
generated, or its token ids, decoded and counted against the token budget."""

from __future__ import annotations

from typing import Any

import numpy as np

from vt_envs.core.text import valid_utf8
from vt_envs.core.tokenizer import ChatTokenizer

__all__ = ["MAX_TEXT_CHARS", "decode_action"]

#: The longest text an action may be, and an observation's ``text``.
MAX_TEXT_CHARS = 1 << 20


def decode_action(
    action: Any, tokenizer: ChatTokenizer, room: int, max_chars: int
) -> tuple[str, bool, int]:
    """Return ``(text, ended_with_eos, token_count)`` of an action.

    Token ids are decoded (and counted as given). A text action is encoded
    only to count it against the token budget; training always uses the
    ids the policy generated, never these.

    ``room``: the tokens left in ``max_episode_tokens``. An action that
    does not fit is counted as ``room + 1`` tokens (text: without being
    encoded when it is provably too long, see
    :meth:`ChatTokenizer.count_up_to`) and only its first
    ``max_chars`` characters (ids: its first ``room + 1`` ids) are
    kept, for the transcript: it ends the episode unparsed.

    Raises ``TypeError`` for an action that is neither text nor a 1-D sequence of ids.
    """
    eos = tokenizer.eos_token
    room = max(0, room)
    if isinstance(action, str):
        action = valid_utf8(action)  # (a lone surrogate would crash the tokenizer)
        count = tokenizer.count_up_to(action, room)
        ended = action.endswith(eos)
        if count > room:
            action = action[:max_chars]
        return action, ended, count
    ids = np.asarray(action)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(
            f"action must be a str or a 1-D sequence of token ids, got {type(action).__name__}"
            f" with shape {ids.shape} and dtype {ids.dtype}"
        )
    ended = bool(len(ids)) and int(ids[-1]) == tokenizer.eos_token_id
    count = min(len(ids), room + 1)  # (over the room: decoded no further than that)
    return tokenizer.decode(ids[:count].tolist()), ended, count
