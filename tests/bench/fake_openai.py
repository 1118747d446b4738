"""A local OpenAI-compatible endpoint for tests: Starlette + uvicorn on loopback.

Its "model" plays VT-Lookup-v0 from the conversation it is sent: it calls
``lookup`` with the key in the question, then answers with the value the tool
returned — except when the request's seed is divisible by ``wrong_every``,
where it answers ``nope`` (so pass@k and intervals have something to show, and
the outcome depends on the seed alone). ``/v1/chat/completions`` reads the
messages; ``/v1/completions`` decodes the prompt's token ids with the shipped
tokenizer and replies with ``token_ids`` (as vLLM's ``return_token_ids``
does) unless ``token_ids=False``. ``delay_s`` slows every reply; ``requests``
counts them; ``fail_next`` makes the next replies 503s.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vt_envs.core.tokenizer import load_tokenizer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeModel:
    def __init__(self, *, wrong_every: int = 3, delay_s: float = 0.0, token_ids: bool = True):
        self.wrong_every, self.delay_s, self.token_ids = wrong_every, delay_s, token_ids
        self.tokenizer = load_tokenizer(None)
        self.requests = 0
        self.fail_next = 0
        self.bodies: list[dict[str, Any]] = []

    def reply(self, conversation: str, seed: int | None) -> str:
        # The episode starts at the task's user turn; the worked examples before it hold
        # other keys and values.
        conversation = "<|im_start|>user\n" + conversation.rsplit("<|im_start|>user\n", 1)[-1]
        outputs = re.findall(r"<\|im_start\|>(?:tool|user)\n([^<\n]+)", conversation)
        key = re.search(r"key (\d+)\?", conversation)
        if key and "assistant\n<lookup>" not in conversation:
            return f"<lookup>{key.group(1)}</lookup>"
        if seed is not None and seed % self.wrong_every == 0:
            return "<answer>nope</answer>"
        value = outputs[-1].strip() if outputs else ""
        return f"<answer>{value}</answer>"

    async def _gate(self, body: dict[str, Any]) -> JSONResponse | None:
        self.requests += 1
        self.bodies.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_next > 0:
            self.fail_next -= 1
            return JSONResponse({"error": "overloaded"}, status_code=503)
        return None

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        if (refused := await self._gate(body)) is not None:
            return refused
        text = "".join(
            f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in body["messages"]
        )
        content = self.reply(text, body.get("seed"))
        return JSONResponse(
            {"choices": [{"message": {"role": "assistant", "content": content},
                          "finish_reason": "stop"}]}
        )  # fmt: skip

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        if (refused := await self._gate(body)) is not None:
            return refused
        text = self.reply(self.tokenizer.decode(body["prompt"]), body.get("seed"))
        choice: dict[str, Any] = {"text": text, "finish_reason": "stop"}
        if self.token_ids:
            choice["token_ids"] = self.tokenizer.encode(text)
        else:  # a server that strips the stop string, as the OpenAI API does
            for stop in body.get("stop") or []:
                text = text.removesuffix(stop)
            choice["text"] = text
        return JSONResponse({"choices": [choice]})


class FakeEndpoint:
    """``with FakeEndpoint(model) as url:`` serves ``model`` at ``url`` (``.../v1``)."""

    def __init__(self, model: FakeModel):
        self.model = model
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", model.chat, methods=["POST"]),
                Route("/v1/completions", model.completions, methods=["POST"]),
            ]
        )
        self.port = _free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the fake endpoint did not start")
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
