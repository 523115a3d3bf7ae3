"""A chat service on loopfence: conversations by id, the answer streamed as server-sent events.

    POST /chat/{conversation}   {"message": "..."}   ->   text/event-stream:
        event: delta   data: {"text": "..."}                       the answer's text, as the model writes it
        event: answer  data: {"text": "...", "log": "..."}          the turn ended with an answer (the last event)
        event: stop    data: {"reason": "...", "limit": ..., "value": ..., "detail": "...", "log": "..."}
                                                                   a fence stopped the turn (the last event)

Each turn is one fenced run with its own log and budgets: it starts from the conversation so far (the
previous answered turn's `result.messages`) plus the new user message. The model may read the files
of CHAT_WORKSPACE (read_file, list_dir). A stopped turn leaves the conversation as it was (its
messages are not kept; its log is). A client that goes away cancels its turn (the run ends
`cancelled`, its stop in the log, with the text streamed so far as its `partial_text`).

    pip install loopfence starlette uvicorn
    cd docs/examples   # its app/config.py is the file the question below asks about
    LOOPFENCE_BASE_URL=http://127.0.0.1:8080/v1 LOOPFENCE_MODEL=qwen uvicorn chat_service:app
    curl -N -X POST localhost:8000/chat/42 -d '{"message": "What is in app/config.py?"}'
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from loopfence import Agent, Limits, OpenAIModel, TextDelta, workspace_tools


def build_app(agent: Agent) -> Starlette:
    """The service around `agent` (its model should stream, e.g. `OpenAIModel(..., stream=True)`)."""
    conversations: dict[str, list[dict[str, Any]]] = {}  # id -> the messages to continue from
    locks: dict[str, asyncio.Lock] = {}  # one turn at a time per conversation

    async def chat(request: Request) -> Response:
        conversation = request.path_params["conversation"]
        try:
            message = (await request.json())["message"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'the body must be {"message": "..."}'}, status_code=400)
        if not isinstance(message, str) or not message.strip():
            return JSONResponse({"error": "message must be a non-empty string"}, status_code=400)
        return StreamingResponse(turn(conversation, message), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def turn(conversation: str, message: str) -> AsyncIterator[str]:
        async with locks.setdefault(conversation, asyncio.Lock()):
            messages = [*conversations.get(conversation, []), {"role": "user", "content": message}]
            async with agent.stream(messages) as run:  # leaving early (the client went away) cancels it
                async for event in run:
                    if isinstance(event, TextDelta):
                        yield sse("delta", {"text": event.text})
            result = run.result
            assert result is not None
            if result.verdict == "SHIP":
                conversations[conversation] = list(result.messages)
                yield sse("answer", {"text": result.final_answer, "log": result.log_path})
            else:
                stop = result.stop
                yield sse("stop", {"reason": str(stop.reason), "limit": stop.data.get("limit"),
                                   "value": stop.data.get("value"), "detail": stop.detail,
                                   "log": result.log_path})

    return Starlette(routes=[Route("/chat/{conversation}", chat, methods=["POST"])])


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def _from_env() -> Starlette:
    """The service on LOOPFENCE_BASE_URL's model, reading the files of CHAT_WORKSPACE (default: the
    current folder) with read_file and list_dir; each turn's log in CHAT_LOGS (default: a folder in
    the temporary directory). The logs hold every conversation: never where the model can read them."""
    workspace = Path(os.environ.get("CHAT_WORKSPACE", ".")).resolve()
    logs = Path(os.environ.get("CHAT_LOGS") or Path(tempfile.gettempdir()) / "loopfence-chat-logs").resolve()
    if logs.is_relative_to(workspace):
        raise SystemExit(f"CHAT_LOGS ({logs}) is inside CHAT_WORKSPACE ({workspace}): the model could read "
                         "every conversation's log; put the logs elsewhere")
    tools = workspace_tools(workspace, ["read_file", "list_dir"], manifest=False)
    return build_app(Agent(model=OpenAIModel.from_env(stream=True), tools=tools, limits=Limits(max_steps=20),
                           log=str(logs)))


# `uvicorn chat_service:app`, with LOOPFENCE_BASE_URL set (a test builds its own: build_app(agent))
app = _from_env() if os.environ.get("LOOPFENCE_BASE_URL") else None
