"""The answer contract: what a finished answer looks like (`Agent(answer=...)`, `run(answer=...)`).

    Agent(model=..., answer=Weather)                  # a pydantic model: result.output is a Weather
    Agent(model=..., answer={"type": "object", ...})  # a JSON schema: result.output is the parsed JSON
    Agent(model=..., answer=lambda text: None if text.strip() else "say something")  # error, or None

A final answer that fails goes back to the model with the error as a user message (`answer_retries`
times, default 1); one that still fails stops the run `answer_rejected`. The ring asks `judge`
(`_steps.judge_answer`); each verdict is an `answer` event, which replay and reconcile take as
recorded (`Recorded`), as they take a recorded approval: they have no contract to run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from .tools._jsonschema import validate_schema

__all__ = ["AnswerArg", "AnswerContract", "Judged", "answer_contract", "as_json"]

AnswerArg = type[BaseModel] | Mapping[str, Any] | Callable[[str], str | None] | None
_FENCE = re.compile(r"^```[\w-]*\s*\n(.*)\n\s*```$", re.DOTALL)
MAX_ERRORS = 5  # of a pydantic model's errors, named in one message


@dataclass(frozen=True, slots=True)
class Judged:
    """One answer judged: `error` None (accepted; `output` its typed value) or the error message."""

    output: Any
    error: str | None


def as_json(text: str) -> str:
    """The answer's JSON text: the text, or the inside of one fenced block (```json ... ```) that is all of it."""
    text = text.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


class AnswerContract:
    """A contract built from `answer=` (`answer_contract`): `judge(text)`, the `feedback` message for
    an error, `retries`, and `describe()` (the header's `answer`)."""

    def __init__(self, spec: AnswerArg, retries: int) -> None:
        self.spec = spec
        self.retries = retries
        if isinstance(spec, type) and issubclass(spec, BaseModel):
            self.kind, self.name, self.schema = "model", spec.__name__, spec.model_json_schema()
        elif isinstance(spec, Mapping):
            self.kind, self.name, self.schema = "schema", str(spec.get("title") or "schema"), dict(spec)
        else:
            self.kind, self.name, self.schema = "check", getattr(spec, "__qualname__", type(spec).__name__), None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "retries": self.retries,
                **({"schema": self.schema} if self.schema is not None else {})}

    def judge(self, text: str) -> Judged:
        if self.kind == "check":
            error = self.spec(text)  # type: ignore[operator]
            if error is not None and not isinstance(error, str):
                raise TypeError(f"answer= {self.name} returned {type(error).__name__}: it returns an error "
                                "message (a str) or None (accepted)")
            return Judged(text, error or None)
        if self.kind == "model":
            try:
                return Judged(self.spec.model_validate_json(as_json(text)), None)  # type: ignore[union-attr]
            except ValidationError as exc:
                return Judged(None, _errors(exc))
        try:
            value = json.loads(as_json(text))
        except ValueError as exc:
            return Judged(None, f"the answer is not JSON: {exc}")
        return Judged(value, validate_schema(value, self.schema or {}, "answer"))

    def feedback(self, error: str) -> str:
        """The user message a rejected answer gets (the same text on replay: it is recorded)."""
        shape = f" Reply with only a JSON object that matches this JSON Schema: {json.dumps(self.schema)}" \
            if self.schema is not None else ""
        return f"loopfence: your answer was not accepted: {error}.{shape}"


def answer_contract(spec: AnswerArg, retries: int = 1) -> AnswerContract | None:
    """`answer=` and `answer_retries=` checked (TypeError or ValueError naming them): the contract, or None."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"answer_retries must be a whole number >= 0, got {retries!r}")
    if spec is None:
        return None
    model = isinstance(spec, type) and issubclass(spec, BaseModel)
    if not (model or isinstance(spec, Mapping) or (callable(spec) and not isinstance(spec, type))):
        raise TypeError(f"answer= takes a pydantic model class, a JSON schema (a dict) or a function (text) -> "
                        f"error message or None, got {spec!r}")
    return AnswerContract(spec, retries)


def _errors(exc: ValidationError) -> str:
    """A pydantic model's errors as one line, each naming its field."""
    errors = exc.errors(include_url=False)
    parts = [f"{'.'.join(map(str, e['loc'])) or 'answer'}: {e['msg']}" for e in errors[:MAX_ERRORS]]
    more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
    return "; ".join(parts) + more
