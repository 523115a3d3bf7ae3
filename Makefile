# Fresh machine: `make run` (the main job) and `make test` (the whole suite) install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
BASE   := $(VENV)/.base-installed
LOCAL  := $(VENV)/.local-installed
BENCH_VENV := bench/.venv
BENCH  := $(BENCH_VENV)/.installed
# llama.cpp built with native flags segfaulted on these machines; these portable flags work.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

.PHONY: run test test-fast docs sandbox redis chromium mcp-servers ts-deps agents local bench clean

$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[agents,docs,langchain,mcp,otel,proxy,pydantic-ai,ray,redis,test]"
	touch $@

# The embedded model: llama-cpp-python compiles from source (about 5 minutes on 2 cores, cached after).
$(LOCAL): $(BASE)
	@echo "installing loopfence[local] (llama-cpp-python builds from source the first time; ~5 min)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" FORCE_CMAKE=1 $(PIP) install -q -e ".[agents,docs,langchain,local,mcp,otel,proxy,pydantic-ai,ray,redis,test]"
	touch $@

# $(call apt_install,COMMAND,PACKAGE,WARNING): Debian's PACKAGE unless COMMAND is there, as root or
# through `sudo -n` (never a password prompt); where the machine does not allow it, a warning, no failure.
define apt_install
@command -v $(1) >/dev/null 2>&1 || { \
  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q $(2) >/dev/null 2>&1 || \
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(2) >/dev/null 2>&1; }; \
  else sudo -n apt-get install -y -q $(2) >/dev/null 2>&1; fi; \
  command -v $(1) >/dev/null 2>&1 || echo "warning: $(3)"; }
endef

# bubblewrap for run_command's sandbox; installed where this machine lets us.
sandbox:
	$(call apt_install,bwrap,bubblewrap,bubblewrap missing: run_command will fail closed)

# Debian's redis-server for the proxy's shared state (tests/_redis_support.py starts its own on a
# loopback port and stops it); installed where this machine lets us. The server is never left running.
redis:
	$(call apt_install,redis-server,redis-server,redis-server missing: the Redis store's tests skip (fail under CI))

# Debian's chromium for the report's browser tests (Playwright drives /usr/bin/chromium; no download).
chromium:
	$(call apt_install,chromium,chromium,chromium missing: the report's browser tests skip)

# Third-party MCP servers for tests/test_mcp_thirdparty.py, pinned, under build/ (never in .venv):
# the reference fetch server from PyPI in a venv of its own, the filesystem server from npm.
MCP_SERVERS := build/mcp-servers
MCP_FETCH_VERSION := 2026.10.24
MCP_FS_VERSION := 2026.8.31
MCP_FETCH := $(MCP_SERVERS)/py/.fetch-$(MCP_FETCH_VERSION)
MCP_FS := $(MCP_SERVERS)/node/.filesystem-$(MCP_FS_VERSION)

$(MCP_FETCH):
	$(PYTHON) -m venv $(MCP_SERVERS)/py
	$(MCP_SERVERS)/py/bin/python -m pip install -q "mcp-server-fetch==$(MCP_FETCH_VERSION)"
	touch $@

$(MCP_FS):
	@command -v npm >/dev/null 2>&1 || { echo "npm missing: install node.js (tests/test_mcp_thirdparty.py fails under CI)"; exit 1; }
	npm install --prefix $(MCP_SERVERS)/node --no-audit --no-fund --save-exact --loglevel=error \
	  "@modelcontextprotocol/server-filesystem@$(MCP_FS_VERSION)"
	touch $@

mcp-servers: $(MCP_FETCH) $(MCP_FS)

# Real agents the proxy's tests drive with no header and no code change (tests/test_proxy_agents.py),
# pinned, in a venv of their own under build/ (their pins are not loopfence's): smolagents'
# ToolCallingAgent and CodeAgent, mini-swe-agent's text mode.
AGENTS := build/agents
SMOLAGENTS_VERSION := 1.26.0
MINI_SWE_AGENT_VERSION := 2.4.6
AGENTS_STAMP := $(AGENTS)/.installed-$(SMOLAGENTS_VERSION)-$(MINI_SWE_AGENT_VERSION)

$(AGENTS_STAMP):
	$(PYTHON) -m venv $(AGENTS)
	$(AGENTS)/bin/python -m pip install -q "smolagents[openai]==$(SMOLAGENTS_VERSION)" \
	  "mini-swe-agent==$(MINI_SWE_AGENT_VERSION)"
	touch $@

# aider (PyPI) in a venv of its own (its pins are not smolagents' nor loopfence's), and opencode (npm),
# pinned: the proxy's tests drive each with no header (tests/test_proxy_coding_agents.py).
AIDER_VERSION := 0.86.2
AIDER_STAMP := $(AGENTS)-aider/.installed-$(AIDER_VERSION)
OPENCODE_VERSION := 1.18.33
OPENCODE_STAMP := $(AGENTS)-opencode/.installed-$(OPENCODE_VERSION)
# Claude Code (npm), pinned: driven through the proxy's Anthropic wire (tests/test_proxy_claude_code.py)
CLAUDE_CODE_VERSION := 2.1.328
CLAUDE_CODE_STAMP := $(AGENTS)-claude/.installed-$(CLAUDE_CODE_VERSION)
# Codex CLI (npm), pinned: driven through the proxy's Responses wire (tests/test_proxy_codex.py)
CODEX_VERSION := 0.169.0
CODEX_STAMP := $(AGENTS)-codex/.installed-$(CODEX_VERSION)
# Gemini CLI (npm), pinned: driven through the proxy's Gemini wire (tests/test_proxy_gemini_cli.py)
GEMINI_CLI_VERSION := 0.61.0
GEMINI_CLI_STAMP := $(AGENTS)-gemini/.installed-$(GEMINI_CLI_VERSION)

$(AIDER_STAMP):
	$(PYTHON) -m venv $(AGENTS)-aider
	$(AGENTS)-aider/bin/python -m pip install -q "aider-chat==$(AIDER_VERSION)"
	touch $@

$(OPENCODE_STAMP):
	@command -v npm >/dev/null 2>&1 || { echo "npm missing: install node.js (the opencode tests fail under CI)"; exit 1; }
	$(call apt_install,rg,ripgrep,ripgrep missing: opencode would download it from GitHub (its tests fail offline))
	npm install --prefix $(AGENTS)-opencode --no-audit --no-fund --save-exact --loglevel=error "opencode-ai@$(OPENCODE_VERSION)"
	touch $@

$(CLAUDE_CODE_STAMP):
	@command -v npm >/dev/null 2>&1 || { echo "npm missing: install node.js (the Claude Code tests fail under CI)"; exit 1; }
	npm install --prefix $(AGENTS)-claude --no-audit --no-fund --save-exact --loglevel=error \
	  "@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)"
	touch $@

$(CODEX_STAMP):
	@command -v npm >/dev/null 2>&1 || { echo "npm missing: install node.js (the Codex tests fail under CI)"; exit 1; }
	npm install --prefix $(AGENTS)-codex --no-audit --no-fund --save-exact --loglevel=error "@openai/codex@$(CODEX_VERSION)"
	touch $@

$(GEMINI_CLI_STAMP):
	@command -v npm >/dev/null 2>&1 || { echo "npm missing: install node.js (the Gemini CLI tests fail under CI)"; exit 1; }
	npm install --prefix $(AGENTS)-gemini --no-audit --no-fund --save-exact --loglevel=error "@google/gemini-cli@$(GEMINI_CLI_VERSION)"
	touch $@

agents: $(AGENTS_STAMP) $(AIDER_STAMP) $(OPENCODE_STAMP) $(CLAUDE_CODE_STAMP) $(CODEX_STAMP) $(GEMINI_CLI_STAMP)

# The proxy's TypeScript clients (tests/ts: an agent loop in plain fetch, the official openai Node SDK),
# pinned by tests/ts/package-lock.json; tsx runs the .ts files on node 20 (no native TypeScript there).
TS_DEPS := tests/ts/node_modules/.installed

$(TS_DEPS): tests/ts/package.json tests/ts/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "npm missing: install node.js (tests/test_proxy_ts.py fails under CI)"; exit 1; }
	cd tests/ts && npm ci --no-audit --no-fund --loglevel=error
	touch $@

ts-deps: $(TS_DEPS)

# The sample task on the sample workspace, with the embedded model (no server, no key). Logs go to runs/.
# The path is quoted: " pages/..." after a word is a different token from "pages/...", and the 135M
# model copies a path into a call only token for token (unquoted, 0 of 10 seeds read the page).
# RUN_SEED/RUN_TEMPERATURE: a row of the README's seed table (scripts/seed_table.py measures this task).
# Exit 0 (SHIP) and 1 (KILL: the fence stopped the tiny model) are both a named end; 2+ fails.
RUN_TASK := Read "pages/tl-intro.html" and make a note of it.
RUN_SYSTEM := You work in a folder of files. Use the tools to read what the task names. \
  When you have read it, reply with a short note in Markdown.
RUN_SEED := 9
RUN_TEMPERATURE := 0.7
# The tools may write: the run works on a fresh copy (runs/workspace), the shipped sample stays clean.
run: $(LOCAL) sandbox
	@rm -rf runs/workspace && mkdir -p runs && cp -R examples/workspace runs/workspace
	@echo "workspace: runs/workspace (a fresh copy of examples/workspace)"
	@$(VENV)/bin/loopfence run '$(RUN_TASK)' --workspace runs/workspace --system "$(RUN_SYSTEM)" \
	  --seed $(RUN_SEED) --temperature $(RUN_TEMPERATURE); rc=$$?; [ $$rc -le 1 ]

test: $(LOCAL) sandbox redis chromium mcp-servers ts-deps agents
	$(PY) -m pytest

test-fast: $(BASE) sandbox redis chromium mcp-servers ts-deps agents
	$(PY) -m pytest -m "not slow and not local_model"

# The documentation site (mkdocs.yml, docs/) into build/site/; strict: a broken link or reference fails.
# The suite builds it too (tests/test_docs_build.py) and runs its examples (tests/test_docs_examples.py).
docs: $(BASE)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	@echo "docs: build/site/index.html"

# Benchmarks: the peers (bench/requirements.txt) go into their own venv, never into loopfence's.
$(BENCH): pyproject.toml bench/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -e . -r bench/requirements.txt
	touch $@

# LiteLLM's proxy (the proxy section's peer) in a venv of its own: its pins conflict with the peers'.
LITELLM_VENV := bench/.venv-litellm
LITELLM := $(LITELLM_VENV)/.installed

$(LITELLM): bench/requirements-litellm.txt
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install -q -r bench/requirements-litellm.txt
	touch $@

bench: $(BENCH) $(LITELLM) redis
	$(BENCH_VENV)/bin/python bench/run.py

clean:
	rm -rf $(VENV) runs .pytest_cache
