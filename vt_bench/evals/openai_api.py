"""Policies behind an OpenAI-compatible endpoint (``vllm serve``, SGLang, a hosted API).

Two ways to talk to one, chosen with ``--api``:

- ``completions`` (:class:`CompletionsEngine`): a
  :class:`~vt_train.engines.base.RolloutEngine` whose prompt is the env's
  token ids (the API takes a list of ints as ``prompt``), so the episode runs
  through the trainer's own rollout loop, token-in / token-out. The ids the
  model wrote come back with vLLM's ``return_token_ids``; from a server
  without it the text is encoded again with the env's tokenizer and the
  generation's ``metrics["retokenized"]`` is 1 (such ids can drift from the
  ones sampled).
- ``chat`` (:class:`ChatAgent`): the conversation is the env's own messages
  (``info["messages"]`` at reset, ``info["message"]`` after each step), images
  sent as PNG data URLs; the reply's text is the action.

The env's stop strings are passed as ``stop`` (with vLLM's
``include_stop_str_in_output`` on the completions API; the chat API gets
standard fields only, and the env's ``tool`` messages as ``user`` ones, which
strict servers require); a server that strips a stop string has it restored:
a closing tag whose opening tag is left open at the end of the text is
appended. Requests are retried on connection errors,
timeouts, 429 and 5xx (they are idempotent: same body, same seed) with
exponential backoff; other HTTP errors raise :class:`EndpointError` at once.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

from vt_envs.errors import VTError

__all__ = ["ChatAgent", "CompletionsEngine", "EndpointError", "OpenAIClient", "restore_stop"]

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class EndpointError(VTError, RuntimeError):
    """The endpoint refused a request or stayed unreachable after the retries."""


class OpenAIClient:
    """A pooled async HTTP client for one endpoint (``base_url`` ends in ``/v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_connections: int = 64,
    ):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.retries, self.backoff_s = retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections),
        )
        self._transient = (httpx.TransportError, httpx.TimeoutException)

    async def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON to ``path``; the decoded reply. Raises :class:`EndpointError`."""
        delay, last = self.backoff_s, ""
        for attempt in range(self.retries + 1):
            try:
                reply = await self._http.post(path, json=dict(body))
            except self._transient as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if reply.status_code < 400:
                    return reply.json()
                last = f"HTTP {reply.status_code}: {reply.text[:500]}"
                if reply.status_code not in _RETRY_STATUS:
                    break
                asked = reply.headers.get("retry-after", "")
                if asked.replace(".", "", 1).isdigit():  # the server says when to come back
                    delay = max(delay, min(float(asked), 60.0))
            if attempt < self.retries:
                await asyncio.sleep(delay)
                delay *= 2
        raise EndpointError(
            f"POST {self.base_url}{path} failed after {attempt + 1} attempt(s): {last}. Check "
            "the server is up, --model names a model it serves, and the API key"
        )

    async def aclose(self) -> None:
        await self._http.aclose()


def restore_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` with a stripped closing stop string put back: when ``text`` ends inside an
    open ``<tag>`` whose ``</tag>`` is a stop string, append it."""
    if any(text.endswith(s) for s in stop if s):
        return text
    for s in stop:
        match = re.fullmatch(r"</([\w-]+)>", s)
        if match and text.rfind(f"<{match.group(1)}>") > text.rfind(s):
            return text + s
    return text


def _sampling_body(params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "include_stop_str_in_output": True,  # vLLM: keep the tag the env parses
        "skip_special_tokens": False,
    }
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = int(params.seed) & 0x7FFFFFFF
    return body


class CompletionsEngine:
    """The completions API as a rollout engine (see the module docstring).

    ``load_weights`` and ``score`` are not offered: an endpoint serves fixed weights.
    """

    weights_version = 0

    def __init__(self, client: OpenAIClient, model: str, tokenizer: Any):
        self.client, self.model, self.tokenizer = client, model, tokenizer

    async def generate(self, prompt_ids: Sequence[int], params: Any, *, images: Sequence[Any] = ()):
        from vt_train.engines.base import Generation

        if images:
            raise EndpointError(
                "the completions API takes token ids only; evaluate image envs with --api chat"
            )
        body = {
            "model": self.model,
            "prompt": [int(i) for i in prompt_ids],
            "logprobs": 1,
            "return_token_ids": True,
            **_sampling_body(params),
        }
        reply = await self.client.post("/completions", body)
        choice = reply["choices"][0]
        text = choice.get("text") or ""
        ids = choice.get("token_ids")
        retokenized = ids is None
        if retokenized:
            text = restore_stop(text, params.stop)
            ids = self.tokenizer.encode(text) if text else []
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        if len(logprobs) != len(ids):
            logprobs = [0.0] * len(ids)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if choice.get("finish_reason") == "length":
            reason = "length"
        elif ids and eos is not None and ids[-1] == eos:
            reason = "eos"
        else:
            reason = "stop"
        return Generation(
            [int(i) for i in ids],
            [float(x) if x is not None else 0.0 for x in logprobs],
            reason,
            metrics={"retokenized": float(retokenized)},
        )

    def load_weights(self, state_dict: Mapping[str, Any]) -> None:
        raise EndpointError("an OpenAI-compatible endpoint serves fixed weights")

    def score(self, sequences: Any, temperature: float = 1.0, *, images: Any = None) -> Any:
        raise EndpointError("an OpenAI-compatible endpoint cannot score sequences here")

    async def aclose(self) -> None:
        await self.client.aclose()


class ChatAgent:
    """One episode's conversation over the chat API (see the module docstring)."""

    def __init__(self, client: OpenAIClient, model: str, params: Any):
        self.client, self.model, self.params = client, model, params
        self.messages: list[dict[str, Any]] = []
        self.images: list[Any] = []

    def start(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> None:
        self.images = list(obs.get("images", ()))
        self.messages = [self._wire(m) for m in info["messages"]]

    def observe(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> None:
        self.images += list(obs.get("images", ()))
        if "message" in info:
            self.messages.append(self._wire(info["message"]))

    async def act(self, seed: int) -> tuple[str, str]:
        """The next action text and the reply's finish reason."""
        from dataclasses import replace

        body = {
            "model": self.model,
            "messages": self.messages,
            **_sampling_body(replace(self.params, seed=seed)),
        }
        # Standard fields only: strict servers (the OpenAI API) refuse vLLM's extras; a
        # stripped stop string is restored below.
        for extra in ("skip_special_tokens", "include_stop_str_in_output"):
            body.pop(extra)
        reply = await self.client.post("/chat/completions", body)
        choice = reply["choices"][0]
        text = restore_stop(choice["message"].get("content") or "", self.params.stop)
        self.messages.append({"role": "assistant", "content": text})
        return text, str(choice.get("finish_reason") or "stop")

    def _wire(self, message: Mapping[str, Any]) -> dict[str, Any]:
        # The env's tool output has role "tool" without a tool_call_id, which strict servers
        # refuse: it travels as the user's turn.
        role = message["role"] if message["role"] in ("system", "user", "assistant") else "user"
        content = message["content"]
        if isinstance(content, str):
            return {"role": role, "content": content}
        parts = []
        for part in content:
            if part.get("type") == "image":
                url = _png_data_url(self.images[int(part["index"])])
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                parts.append({"type": "text", "text": part.get("text", "")})
        return {"role": role, "content": parts}


def _png_data_url(image: Any) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
