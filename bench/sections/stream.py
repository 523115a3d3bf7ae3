"""4. Stream assembly: one long recorded-shape stream assembled by loopfence and by the openai SDK's
accumulator (ChatCompletionStreamState, what `client.chat.completions.stream()` uses), as a ratio.

Two inputs: parsed chunk dicts (loopfence `assemble`; the SDK builds each chunk with `construct_type`
as its Stream does, then `handle_chunk`), and the raw SSE body (loopfence `assemble_sse`; the SDK's
SSEDecoder, json, construct_type, handle_chunk). Both results are checked to be the same calls first.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from loopfence.models._stream import assemble, assemble_sse

from ..report import Section, table
from ..streamdata import expected_calls, long_stream, to_sse

TITLE = "Stream assembly"
GOAL = 2.0
FULL = {"n_calls": 8, "arg_chars": 2000, "reps": 15}
QUICK = {"n_calls": 4, "arg_chars": 200, "reps": 3}


def _sdk() -> dict[str, Callable[[Any], Any]] | None:
    try:
        from openai._models import construct_type
        from openai._streaming import SSEDecoder
        from openai.lib.streaming.chat import ChatCompletionStreamState
        from openai.types.chat import ChatCompletionChunk
    except ImportError:
        return None

    def from_chunks(chunks: list[dict[str, Any]]) -> Any:
        state: Any = ChatCompletionStreamState()
        for c in chunks:
            state.handle_chunk(construct_type(type_=ChatCompletionChunk, value=c))
        return state.get_final_completion()

    def from_sse(body: bytes) -> Any:
        state: Any = ChatCompletionStreamState()
        for sse in SSEDecoder().iter_bytes(iter([body])):
            if sse.data.startswith("[DONE]"):
                break
            state.handle_chunk(construct_type(type_=ChatCompletionChunk, value=sse.json()))
        return state.get_final_completion()

    return {"chunks": from_chunks, "sse": from_sse}


def _median_s(fn: Callable[[Any], Any], arg: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(frameworks: dict[str, ModuleType], quick: bool) -> Section:
    cfg = QUICK if quick else FULL
    chunks = long_stream(cfg["n_calls"], cfg["arg_chars"])
    sse = to_sse(chunks)
    want = expected_calls(cfg["n_calls"], cfg["arg_chars"])
    for reply in (assemble(chunks), assemble_sse(sse)):
        got = [(c.id, c.name, c.arguments) for c in reply.tool_calls]
        if got != want or not reply.complete:
            raise RuntimeError("loopfence assembled the benchmark stream wrongly")
    sdk = _sdk()
    intro = (f"{len(chunks):,} chunks ({len(sse.encode()):,} bytes of SSE): a content prelude and "
             f"{cfg['n_calls']} parallel calls, arguments in 4-character fragments, interleaved. "
             f"Median of {cfg['reps']} assemblies. Goal: loopfence at least {GOAL:g}x the SDK.")
    ours = {"chunks": _median_s(assemble, chunks, cfg["reps"]),
            "sse": _median_s(assemble_sse, sse, cfg["reps"])}
    if sdk is None:
        rows = [[k, f"{v * 1e3:.2f}", "openai not installed", ""] for k, v in ours.items()]
        return Section(TITLE, intro + "\n\n" + table(["input", "loopfence ms", "SDK ms", "ratio"], rows),
                       {"loopfence_s": ours})
    for fn, arg in ((sdk["chunks"], chunks), (sdk["sse"], sse.encode())):
        final = fn(arg)
        got = [(c.id, c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls]
        if got != want:
            raise RuntimeError("the SDK assembled the benchmark stream differently")
    theirs = {"chunks": _median_s(sdk["chunks"], chunks, cfg["reps"]),
              "sse": _median_s(sdk["sse"], sse.encode(), cfg["reps"])}
    labels = {"chunks": "parsed chunk dicts", "sse": "raw SSE body"}
    rows = [[labels[k], f"{ours[k] * 1e3:.2f}", f"{theirs[k] * 1e3:.2f}", f"{theirs[k] / ours[k]:.1f}x"]
            for k in ours]
    md = intro + "\n\n" + table(["input", "loopfence ms", "openai SDK ms", "loopfence speed-up"], rows)
    return Section(TITLE, md, {"chunks": len(chunks), "loopfence_s": ours, "sdk_s": theirs})
