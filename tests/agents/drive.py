"""One real agent run against an OpenAI-compatible base URL, with the agent's own code unchanged:
run by the agents' own venv (build/agents, `make agents`), never by loopfence's.

    build/agents/bin/python tests/agents/drive.py KIND BASE_URL TASK [--max-steps N] [--workdir DIR]

KIND: tool_calling (smolagents ToolCallingAgent), code (smolagents CodeAgent), mini (mini-swe-agent's
text mode: its mini_textbased.yaml templates, LitellmTextbasedModel, a local environment in DIR).
Prints one JSON line: {"output", "state", "error", "steps"}; exit 0 unless the agent crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost map download (loopback only)
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")


def smol(kind: str, url: str, task: str, max_steps: int) -> dict[str, Any]:
    from smolagents import CodeAgent, OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def fetch_status(service: str) -> str:
        """The status page of a service.

        Args:
            service: the service's name.
        """
        return "503 Service Unavailable" if service == "flaky" else f"{service}: OK"

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        return f"Sunny, 20C in {city}"

    model = OpenAIServerModel(model_id="m", api_base=url, api_key="sk-client")
    cls = ToolCallingAgent if kind == "tool_calling" else CodeAgent
    tools = [fetch_status, get_weather] if kind == "tool_calling" else []
    agent = cls(tools=tools, model=model, max_steps=max_steps, verbosity_level=0)
    res = agent.run(task, return_full_result=True)
    steps = [s for s in agent.memory.steps if type(s).__name__ == "ActionStep"]
    return {"output": None if res.output is None else str(res.output), "state": res.state, "steps": len(steps),
            "errors": [str(s.error) for s in steps if getattr(s, "error", None) is not None]}


def mini(url: str, task: str, max_steps: int, workdir: str) -> dict[str, Any]:
    import yaml
    import minisweagent
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    config = yaml.safe_load((Path(minisweagent.__file__).parent / "config" / "mini_textbased.yaml").read_text())
    agent_config = {k: v for k, v in config["agent"].items() if k != "mode"} | {"step_limit": max_steps, "cost_limit": 0}
    model_config = dict(config.get("model") or {})
    kwargs = dict(model_config.pop("model_kwargs", None) or {}) | {"api_base": url, "api_key": "sk-client"}
    model = LitellmTextbasedModel(model_name="openai/m", model_kwargs=kwargs, cost_tracking="ignore_errors",
                                  **model_config)
    env = LocalEnvironment(cwd=workdir, **config.get("environment", {}))
    agent = DefaultAgent(model, env, **agent_config)
    info = agent.run(task)
    return {"output": info.get("submission"), "state": info.get("exit_status"), "steps": agent.n_calls if hasattr(agent, "n_calls") else None}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["tool_calling", "code", "mini"])
    p.add_argument("url")
    p.add_argument("task")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--workdir", default=".")
    a = p.parse_args()
    try:
        out = mini(a.url, a.task, a.max_steps, a.workdir) if a.kind == "mini" else smol(a.kind, a.url, a.task, a.max_steps)
    except Exception as exc:  # noqa: BLE001 - the crash is what the test looks at
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}))
        return 1
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
