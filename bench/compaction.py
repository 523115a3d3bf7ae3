"""Seed 003, breaks 3 and 4 in numbers: compaction on vs off, and the 144 KB page against a window.

    .venv/bin/python bench/compaction.py                 # all sections
    .venv/bin/python bench/compaction.py pages overflow  # some of them: pages, overflow, server, overhead

pages     The five-page read (pages of ~1,300 characters of the Pi article, then a note), scripted
          so the same pages are read every time; prompt tokens per turn counted with the embedded
          model's tokenizer (SmolLM2, llama.cpp, vocab only) over the prompt as actually sent:
          ChatML with the tool schemas in the system turn and the tool results in their own turns.
          Compaction off vs keep_turns=1, 2, 3.
overflow  The 144 KB page (103 KB inline CSS) read whole (break 3's plain read_file) into a 32,768-
          and a 4,096-token window, behind a model that refuses an oversize prompt the way llama.cpp's
          server does (HTTP 400). With the model's own count (`count_tokens`) and with the
          characters-per-token estimate. Then the built-in read_file (HTML to text, pages).
server    The same page against a real `llama_cpp.server` (n_ctx 32768) through OpenAIModel: with
          context_window set the request is never sent; without it the server refuses it.
overhead  The state's per-step cost (append a reply and a 1,300-character result, estimate, build
          the request) at N = 100 / 1,000 / 10,000 steps, compaction on and off; and the whole ring.

Numbers, not assertions: this is a benchmark, not a timed test.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loopfence import Limits, Policy, ScriptedModel, StopReason, run, tool
from loopfence._compact import Compaction
from loopfence._json import canonical_json
from loopfence._messages import Reply, Request, Usage
from loopfence._state import RunState
from loopfence._stops import StopError
from loopfence.runlog import RunLog
from loopfence.testing import calls_reply, text_reply, tool_call
from loopfence.tools import Executor, Registry, workspace_tools

ROOT = Path(__file__).resolve().parent.parent
SEED = next((ROOT.parent / "shared" / "seeds").glob("003_*.md"), None)
SYSTEM = ("You are a curator. Read the file you are given, then reply with a note of at most five lines: "
          "the key facts and the source.")
NOTE = ("**Key facts:** Pi is a small coding agent; the loop is a ring of send, remember, stop gate and "
        "run tools; four breaks and four fixes.\n**Source:** pages/pi-post-text.txt")


# -- text ----------------------------------------------------------------------------------------------
def article(chars: int = 6_425) -> str:
    """Prose from seed 003 (the Pi-agent post); a stand-in of the same size if the seed is absent."""
    if SEED is not None:
        body = SEED.read_text(encoding="utf-8")
        body = body[body.find("As we all probably"):]
        text = " ".join(line.strip() for line in body.splitlines() if line.strip() and not line.startswith("```"))
    else:
        text = "An agent is a loop with model calls and tool calls. " * 200
    return text[:chars]


def big_page(total: int = 144 * 1024, css: int = 103 * 1024) -> str:
    """144 KB of HTML as the browser gets it: 103 KB of inline CSS, markup, ~6.4 KB of article text."""
    parts = ["header", "nav", "post", "card", "footer", "sidebar", "button", "toc", "code", "quote"]
    states = ["", ":hover", " a", " p", " > li", "::before", ".is-active", " .title"]
    rules = []
    for i in range(4000):
        sel = f".{parts[i % 10]}-{parts[(i // 10) % 10]}{states[i % 8]}"
        rules.append(f"{sel} {{ margin: 0 auto; padding: 0.5rem 1rem; color: var(--muted); "
                     f"font: 17px/1.6 Georgia, serif; border-bottom: 1px solid #e5e7eb; }}\n")
    style = f"<style>{''.join(rules)[:css]}</style>"
    words = article().split(" ")
    paras = "".join(f'<p class="post-body">{" ".join(words[i:i + 40])}</p>\n' for i in range(0, len(words), 40))
    head = f"<!doctype html><html><head><title>Pi, a small coding agent</title>{style}</head><body>"
    nav = '<li class="nav-item"><a class="nav-link" href="/posts/">Posts</a></li>\n'
    pad = total - len(head) - len(paras) - 40
    menu = f'<nav class="site-nav"><ul>{(nav * (pad // len(nav) + 1))[:pad]}</ul></nav>'
    return f"{head}{menu}<main>{paras}</main></body></html>"


# -- the embedded model's tokenizer over the prompt as sent -----------------------------------------------
class Tokenizer:
    """SmolLM2's tokenizer (llama.cpp, vocab only) over a ChatML rendering of a request."""

    def __init__(self) -> None:
        from llama_cpp import Llama

        from loopfence.models._local import default_model_path

        self.llm = Llama(model_path=str(default_model_path()), vocab_only=True, verbose=False)

    def tokens(self, text: str) -> int:
        return len(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        out = []
        for m in messages:
            role, content = m["role"], m.get("content") or ""
            if role == "system" and tools:
                content += "\n\nYou have access to the following functions:\n" + "".join(
                    f"\nfunctions.{t['function']['name']}:\n{json.dumps(t['function']['parameters'])}\n"
                    for t in tools)
            for c in m.get("tool_calls") or []:
                content += f"functions.{c['function']['name']}:\n{c['function']['arguments']}"
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        return "".join(out) + "<|im_start|>assistant\n"

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        return self.tokens(self.render(messages, tools))


class CountingModel:
    """Scripted replies; usage counted by the tokenizer; refuses an oversize prompt like a server.

    count_tokens is the optional Model method the state uses for its pre-send check."""

    def __init__(self, replies: list[dict], tok: Tokenizer, window: int | None = None,
                 offer_count: bool = True) -> None:
        self.inner = ScriptedModel(replies)
        self.tok = tok
        self.window = window
        self.sent: list[int] = []
        if offer_count:
            self.count_tokens = tok.count

    def complete(self, request: Request) -> Reply:
        n = self.tok.count(request.messages, request.tools)
        self.sent.append(n)
        if self.window is not None and n > self.window:
            raise StopError(StopReason.ENDPOINT_ERROR, f"HTTP 400: request ({n} tokens) exceeds the "
                            f"available context size ({self.window} tokens), try increasing it", status=400)
        reply = self.inner.complete(request)
        done = self.tok.tokens(canonical_json(reply.message()))
        return Reply(reply.content, reply.tool_calls, reply.finish_reason, Usage(n, done), reply.raw)


# -- pages -------------------------------------------------------------------------------------------
def pages(tok: Tokenizer) -> None:
    text = article()
    print(f"\n## Five-page read: {len(text):,} characters of seed 003's Pi article in pages of 1,300, "
          "then a note (tokens: SmolLM2 tokenizer)\n")
    rows: dict[str, list[int]] = {}
    for label, compaction in [("off", Compaction.off()), ("keep_turns=3", Compaction(keep_turns=3)),
                              ("keep_turns=2 (default)", Compaction(keep_turns=2)),
                              ("keep_turns=1", Compaction(keep_turns=1))]:
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "pages").mkdir()
            (Path(d) / "pages" / "pi-post-text.txt").write_text(text)
            tools = workspace_tools(d, names=["read_file"], page_chars=1_300)
            script = [calls_reply(tool_call("read_file", path="pages/pi-post-text.txt", page=n))
                      for n in range(1, 6)] + [text_reply(NOTE)]
            model = CountingModel(script, tok)
            log = RunLog(None)
            r = run("Make a note from pages/pi-post-text.txt", model=model, tools=tools, system=SYSTEM,
                    compaction=compaction, log=log)
            assert r.stop.reason is StopReason.FINAL_ANSWER, r.stop
            reads = [e for e in log.events if e["event"] == "result" and e["decision"] == "executed"]
            assert len(reads) == 5, "the same five pages are read every time"
            rows[label] = [p for p, _ in r.ledger_per_step] if hasattr(r, "ledger_per_step") else \
                [e["usage"]["prompt_tokens"] for e in log.events if e["event"] == "reply"]
    off = sum(rows["off"])
    print("| turn | " + " | ".join(rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for t in range(6):
        print(f"| {t + 1} | " + " | ".join(f"{v[t]:,}" for v in rows.values()) + " |")
    print("| total | " + " | ".join(f"{sum(v):,} ({sum(v) / off:.0%})" for v in rows.values()) + " |")


# -- overflow ---------------------------------------------------------------------------------------------
def overflow(tok: Tokenizer) -> None:
    page = big_page()
    print(f"\n## The 144 KB page ({len(page):,} characters, {page.find('</style>') - page.find('<style>'):,} "
          f"of inline CSS): {tok.tokens(page):,} tokens on its own\n")

    def whole(path: str) -> str:
        """Read a file whole (break 3's plain read_file)."""
        return page

    print("| reader | window | count | stop | requests sent | next prompt: estimate / counted |")
    print("|---|---|---|---|---|---|")
    for window in (32_768, 4_096):
        for offer in (True, False):
            script = [calls_reply(tool_call("read_file", path="pages/pi.html")), text_reply(NOTE)]
            model = CountingModel(script, tok, window, offer_count=offer)
            reg = Registry([tool(whole, name="read_file", kind="read_only")])
            r = run("Make a note from pages/pi.html", model=model, tools=reg, system=SYSTEM, log=RunLog(None),
                    limits=Limits(context_window=window, max_prompt_tokens=None), executor=Executor(result_cap=None))
            counted = tok.count(list(r.messages), reg.schemas())
            print(f"| whole file, uncapped | {window:,} | {'count_tokens' if offer else 'estimate'} | "
                  f"{r.stop.reason} | {len(model.sent)} | {r.stop.data.get('value', '-'):,} / {counted:,} |")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "pages").mkdir()
        (Path(d) / "pages" / "pi.html").write_text(page)
        for window in (32_768, 4_096):
            script = [calls_reply(tool_call("read_file", path="pages/pi.html")), text_reply(NOTE)]
            model = CountingModel(script, tok, window)
            r = run("Make a note from pages/pi.html", model=model, system=SYSTEM, log=RunLog(None),
                    tools=workspace_tools(d, names=["read_file"]), limits=Limits(context_window=window))
            print(f"| built-in read_file (HTML to text, 4,000-char pages) | {window:,} | count_tokens | "
                  f"{r.stop.reason} | {len(model.sent)} | largest prompt sent: {max(model.sent):,} |")


# -- a real llama.cpp server --------------------------------------------------------------------------------
def server(tok: Tokenizer) -> None:
    import httpx

    from loopfence._loop import drive, new_state
    from loopfence._guards import default_guards
    from loopfence._gate import UntrustedGate
    from loopfence.models._local import default_model_path
    from loopfence.models._openai import OpenAIModel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # plain chatml: chatml-function-calling drops tool results from the prompt (the page never arrives)
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_path()), "--chat_format",
           "chatml", "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "32768",
           "--n_threads", "2", "--seed", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "NO_PROXY": "*"})
    base = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        page = big_page()
        reg = Registry([tool(lambda path: page, name="read_file", kind="read_only")])
        print("\n## The 144 KB page against a real llama_cpp.server, n_ctx 32768 (the read already done;\n"
              "assistant content \"\" because that server refuses content: null with HTTP 500)\n")
        print("| context_window | stop | detail |")
        print("|---|---|---|")
        for window in (32_768, None):
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Make a note from pages/pi.html"},
                    {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function",
                     "function": {"name": "read_file", "arguments": "{\"path\":\"pages/pi.html\"}"}}]},
                    {"role": "tool", "tool_call_id": "c0", "content": page}]
            limits = Limits(context_window=window, max_prompt_tokens=None)
            state = new_state(reg, limits, Policy(), {}, msgs)
            with OpenAIModel(base, "smollm2", max_retries=0, request_timeout=120) as model:
                r = drive(state, model, RunLog(None), default_guards(limits, None, UntrustedGate()), Executor())
            print(f"| {window} | {r.stop.reason} | {r.stop.detail[:400]} |")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


# -- overhead -----------------------------------------------------------------------------------------------
def overhead() -> None:
    print("\n## Per-step cost of the state (append reply + 1,300-char result, estimate, request)\n")
    result = "x" * 1_300
    reg = Registry([tool(lambda path, page=1: f"page {page}\n{result}", name="read_file", kind="read_only")])
    print("| N steps | compaction | mean µs/step | last 10% µs/step |")
    print("|---|---|---|---|")
    for n in (100, 1_000, 10_000):
        for label, comp in [("keep_turns=2", Compaction()), ("off", Compaction.off())]:
            s = RunState(Limits(), Policy(), reg, messages=[{"role": "user", "content": "go"}], compaction=comp)
            times = []
            for i in range(n):
                t = time.perf_counter()
                s.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                          "function": {"name": "read_file", "arguments": f"{{\"path\":\"p\",\"page\":{i}}}"}}]})
                s.append({"role": "tool", "tool_call_id": f"c{i}", "content": result})
                s.next_prompt_estimate()
                s.request()
                times.append(time.perf_counter() - t)
            tail = times[-max(1, n // 10):]
            print(f"| {n:,} | {label} | {statistics.mean(times) * 1e6:.1f} | {statistics.mean(tail) * 1e6:.1f} |")
    print("\n## The whole ring per step (scripted model, one read_only call per step, log in memory)\n")
    print("| N steps | compaction | µs/step |")
    print("|---|---|---|")
    for n in (100, 1_000):
        for label, comp in [("keep_turns=2", Compaction()), ("off", Compaction.off())]:
            script = [calls_reply(tool_call("read_file", path="p", page=i)) for i in range(n)] + [text_reply("ok")]
            lim = Limits(max_steps=None, max_tool_calls=None, max_prompt_tokens=None, max_completion_tokens=None,
                         max_wall_seconds=None, tool_timeout_s=None)
            t = time.perf_counter()
            r = run("t", model=ScriptedModel(script), tools=reg, limits=lim, compaction=comp, log=RunLog(None))
            dt = time.perf_counter() - t
            assert r.stop.reason is StopReason.FINAL_ANSWER, r.stop
            print(f"| {n:,} | {label} | {dt / (n + 1) * 1e6:.0f} |")


def main(argv: list[str]) -> None:
    wanted = argv or ["pages", "overflow", "overhead"]
    tok = Tokenizer() if {"pages", "overflow", "server"} & set(wanted) else None
    for name in wanted:
        {"pages": lambda: pages(tok), "overflow": lambda: overflow(tok), "server": lambda: server(tok),
         "overhead": overhead}[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
