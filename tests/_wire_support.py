"""The recorded wire captures in tests/data/wire/ (see SOURCES.md there) and what each one holds.

Cassettes are VCR YAML: `interactions[].request/response`, the body under `body.string` or, in
pydantic-ai's files, already parsed under `parsed_body`. simonw-llm's chain test keeps the gzip
bytes of its bodies (the recorded headers were cut to content-type, so nothing says gzip but the
magic bytes): they are decompressed here. Interactions with a non-chat.completions URL (Gemini's
native API in one file) are not chat.completions exchanges and are left out.

EXPECTED was written by reading the raw captures (not by running the assembler): per file, per
chat.completions interaction, the calls the provider sent as (name, arguments), or the named
stop the exchange must end in, or TEXT for an answer without calls.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["WIRE", "Exchange", "load_exchanges", "wire_files", "EXPECTED", "TEXT", "sse_bodies"]

WIRE = Path(__file__).resolve().parent / "data" / "wire"
TEXT = "text"


@dataclass(frozen=True)
class Exchange:
    file: str
    n: int  # interaction number in the file
    status: int
    content_type: str
    body: Any  # str for event streams, parsed JSON otherwise
    tools: tuple[dict[str, Any], ...]  # the tools the request sent
    streamed: bool

    def form(self) -> dict[str, Any]:
        """The fake-server reply form that replays this response."""
        if self.streamed:
            return {"sse": self.body}
        if self.status != 200:
            return {"status": self.status, "body": self.body}
        return self.body


def _text(raw: Any) -> str:
    if isinstance(raw, bytes):
        return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
    return raw


def _request_tools(req: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    body = req.get("parsed_body")
    if body is None and isinstance((req.get("body")), str):
        try:
            body = json.loads(req["body"])
        except ValueError:
            body = None
    tools = body.get("tools") if isinstance(body, dict) else None
    return tuple(t for t in tools or [] if isinstance(t, dict) and t.get("type") == "function")


def wire_files() -> list[str]:
    return sorted(p.name for p in WIRE.iterdir() if p.suffix in (".sse", ".yaml"))


def load_exchanges(name: str) -> list[Exchange]:
    path = WIRE / name
    if path.suffix == ".sse":
        return [Exchange(name, 0, 200, "text/event-stream", path.read_text(encoding="utf-8"), (), True)]
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    out = []
    for n, it in enumerate(data["interactions"]):
        req, resp = it["request"], it["response"]
        if not req["uri"].endswith("/chat/completions"):
            continue
        headers = {k.lower(): v[0] for k, v in (resp.get("headers") or {}).items()}
        ctype = headers.get("content-type", "")
        if "parsed_body" in resp:
            body: Any = resp["parsed_body"]
        else:
            body = _text(resp["body"]["string"])
            if "text/event-stream" not in ctype:
                body = json.loads(body)
        out.append(Exchange(name, n, int(resp["status"]["code"]), ctype, body, _request_tools(req),
                            "text/event-stream" in ctype))
    return out


def sse_bodies() -> list[tuple[str, int, str]]:
    """Every recorded event-stream body: (file, interaction, body)."""
    return [(e.file, e.n, e.body) for f in wire_files() for e in load_exchanges(f) if e.streamed]


_WEATHER_ANSWERS = {"answers": [
    {"label": "Capital", "answer": "The capital of Mexico is Mexico City."},
    {"label": "Weather", "answer": "The weather in Mexico City is currently sunny."},
    {"label": "Product Name", "answer": "The product name is Pydantic AI."}]}
_LLM_VERSION = {0: [("llm_version", {})], 1: TEXT}

# file -> {interaction: [(name, arguments), ...] | TEXT | "stop:<reason>"}
EXPECTED: dict[str, dict[int, Any]] = {
    "openai-python__4cc50a6135d2.sse": {0: TEXT},  # finish_reason "length"
    "openai-python__a247c49c5fcd.sse": {0: [("get_weather", {"city": "San Francisco", "state": "CA"})]},
    "openai-python__c6aa7e397b71.sse": {0: [("GetWeatherArgs", {"city": "Edinburgh", "country": "UK", "units": "c"})]},
    "openai-python__single_call_split.sse": {0: [("get_weather", {"city": "New York City"})]},
    "openai-python__two_parallel_calls.sse": {0: [
        ("GetWeatherArgs", {"city": "Edinburgh", "country": "GB", "units": "c"}),
        ("get_stock_price", {"ticker": "AAPL", "exchange": "NASDAQ"})]},
    "pydantic-ai__test_compatible_api_with_tool_calls_without_id.yaml": {0: [("get_current_time", {})], 1: TEXT},
    "pydantic-ai__test_complex_agent_run.yaml": {
        0: [("get_country", {}), ("get_product_name", {})],
        1: [("get_weather", {"city": "Mexico City"})],
        2: [("final_result", _WEATHER_ANSWERS)]},
    "pydantic-ai__test_deepseek_deferred_capability_with_thinking.yaml": {
        0: [("load_capability", {"id": "DICE_ROLL"})], 1: [("get_player_name", {}), ("roll_dice", {})], 2: TEXT},
    "pydantic-ai__test_groq_tool_use_failed_error.yaml": {
        0: "stop:schema_mismatch", 1: [("get_something_by_name", {"name": "test"})], 2: TEXT},
    "pydantic-ai__test_groq_tool_use_failed_error_streaming.yaml": {
        0: "stop:schema_mismatch", 1: [("get_something_by_name", {"name": "example"})], 2: TEXT},
    "pydantic-ai__test_groq_tool_use_failed_error_with_text.yaml": {
        0: "stop:invalid_json", 1: [("final_result", {"response": "yes"})]},
    "pydantic-ai__test_max_completion_tokens.yaml": {0: TEXT},  # finish_reason "length", tool_calls []
    "pydantic-ai__test_multiple_agent_tool_calls.yaml": {2: [("get_capital", {"country": "England"})], 3: TEXT},
    "pydantic-ai__test_ollama_cloud_tool_output.yaml": {0: TEXT, 1: [("final_result", {"city": "Paris", "country": "France"})]},
    "pydantic-ai__test_openrouter_stream_error.yaml": {0: "stop:endpoint_error"},  # error chunk, then [DONE]
    "pydantic-ai__test_openrouter_tool_optional_parameters.yaml": {0: [("find_education_content", {})]},  # no arguments key
    "pydantic-ai__test_prefect_agent_with_hitl_tool.yaml": {
        0: [("delete_file", {"path": ".env"}), ("create_file", {"path": "test.txt"})], 1: TEXT},
    "pydantic-ai__test_run_stream_sync_streams_real_model.yaml": {0: [("get_capital", {"country": "UK"})], 1: TEXT},
    "pydantic-ai__test_snowflake_tool_calling.yaml": {  # finish_reason "", empty legacy function_call
        0: [("get_weather", {"city": "Mexico City"})], 1: TEXT},
    "pydantic-ai__test_temporal_agent_with_model_retry.yaml": {
        0: [("get_weather_in_city", {"city": "CDMX"})], 1: [("get_weather_in_city", {"city": "Mexico City"})], 2: TEXT},
    "pydantic-ai__test_tool_choice_matrix_tools_plus_output-groq_.yaml": {0: [
        ("get_weather", {"city": "Paris"}), ("final_result", {"city": "Paris", "summary": "Current weather in Paris"})]},
    "simonw-llm__test_tool_use_basic.yaml": {0: [("multiply", {"a": 1231, "b": 2331})], 1: TEXT},
    "simonw-llm__test_tool_use_chain_of_two_calls.yaml": {  # gzip bodies
        0: [("lookup_population", {"country": "Crumpet"})], 1: [("can_have_dragons", {"population": 123124})], 2: TEXT},
    "simonw-llm__test_tools_streaming_variant_a.yaml": _LLM_VERSION,  # id and name repeated in every delta
    "simonw-llm__test_tools_streaming_variant_b.yaml": _LLM_VERSION,
    "simonw-llm__test_tools_streaming_variant_c.yaml": _LLM_VERSION,  # body starts with " data:"
    "simonw-llm__test_tools_streaming_variant_d.yaml": _LLM_VERSION,  # arguments null
}
