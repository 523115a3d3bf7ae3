"""Prices: dollars per million tokens for the cost budget (`Limits(max_cost_usd=...)`).

A `PriceBook` answers the price of a model name, in this order:

1. the user's table (`prices={"my-model": (in_per_mtok, out_per_mtok)}` or a TOML file, `--prices`);
2. the `genai-prices` package's table (a maintained price list for many providers and models; looked
   up by name, so `gpt-4o-2024-08-06` finds `gpt-4o`);
3. the user's `"*"` entry, if any: the price of a model neither knows (a local model whose adapter
   does not say its name, the scripted model).

A price is resolved once per name: genai-prices' rates for one million input tokens and one million
output tokens (where a provider's price is tiered by prompt size, that is the upper tier: a budget
check errs on the side of stopping). `genai-prices` is imported only when a run has a cost budget or
a price table and a name is not in the user's table (importing it takes about half a second).

TOML: one key per model, its value `[input, output]` or `{ input = 2.5, output = 10 }` (dollars per
million tokens), e.g.::

    "gpt-4o" = [2.5, 10]
    "qwen2.5-7b-instruct" = { input = 0, output = 0 }
    "*" = [0.1, 0.4]
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Price", "PriceBook", "PriceError", "PricesArg", "ANY_MODEL", "load_prices", "price_book"]

ANY_MODEL = "*"
_MTOK = 1_000_000
PricesArg = Mapping[str, Any] | str | Path | None


class PriceError(ValueError):
    """A price table that cannot be used, or a cost budget for a model with no price."""


@dataclass(frozen=True, slots=True)
class Price:
    """Dollars per million input (prompt) and output (completion) tokens of one model."""

    model: str
    input_per_mtok: float
    output_per_mtok: float
    source: str  # "prices" (the user's table), "prices:*", or "genai-prices <version>"

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Dollars for one request, rounded to a billionth of a dollar (the ledger adds these up)."""
        return round((prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok) / _MTOK, 9)

    def to_json(self) -> list[Any]:
        return [self.input_per_mtok, self.output_per_mtok, self.source]


def _rate(model: str, what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PriceError(f"prices: {model!r} {what} price must be a finite number of dollars per million "
                         f"tokens >= 0, got {value!r}")
    return float(value)


def _pair(model: str, value: Any) -> tuple[float, float]:
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"input", "output"})
        if unknown or set(value) != {"input", "output"}:
            raise PriceError(f"prices: {model!r} must have exactly `input` and `output` (dollars per million "
                             f"tokens), got keys {sorted(value)}")
        value = (value["input"], value["output"])
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise PriceError(f"prices: {model!r} must be (input, output) dollars per million tokens, got {value!r}")
    return _rate(model, "input", value[0]), _rate(model, "output", value[1])


def load_prices(source: Mapping[str, Any] | str | Path) -> dict[str, tuple[float, float]]:
    """A user price table: a mapping, or a TOML file's path. PriceError naming what is wrong."""
    if isinstance(source, (str, Path)):
        try:
            with open(source, "rb") as f:
                data: Mapping[str, Any] = tomllib.load(f)
        except OSError as exc:
            raise PriceError(f"prices file {source}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise PriceError(f"prices file {source}: not TOML: {exc}") from None
    else:
        data = source
    out: dict[str, tuple[float, float]] = {}
    try:
        for model, value in data.items():
            if not isinstance(model, str) or not model:
                raise PriceError(f"prices: a model name must be a non-empty string, got {model!r}")
            out[model] = _pair(model, value)
    except PriceError as exc:
        if isinstance(source, (str, Path)):  # say which file
            raise PriceError(f"prices file {source}: {str(exc).removeprefix('prices: ')}") from None
        raise
    return out


def _genai(model: str) -> Price | None:
    """genai-prices' price for `model`, or None when it knows no such model."""
    from genai_prices import Usage, __version__, calc_price

    try:
        p = calc_price(Usage(input_tokens=_MTOK, output_tokens=_MTOK), model)
    except LookupError:
        return None
    return Price(model, float(p.input_price), float(p.output_price), f"genai-prices {__version__}")


class PriceBook:
    """The user's table over genai-prices' (see the module docstring); each name resolved once."""

    def __init__(self, table: Mapping[str, tuple[float, float]] | None = None) -> None:
        self.table = dict(table or {})
        self._seen: dict[str, Price | None] = {}

    def price(self, model: str | None, any_model: bool = True) -> Price | None:
        """The price of `model` (None: the adapter does not say its name), or None when unknown;
        `any_model=False`: not the "*" entry (a reply's model name that nothing knows is priced as
        the request was)."""
        if model is not None and model in self.table:
            return Price(model, *self.table[model], "prices")
        if model is not None and model != ANY_MODEL:
            if model not in self._seen:
                self._seen[model] = _genai(model)
            if (known := self._seen[model]) is not None:
                return known
        if any_model and ANY_MODEL in self.table:
            return Price(model or ANY_MODEL, *self.table[ANY_MODEL], "prices:*")
        return None

    def require(self, model: str | None, who: str) -> Price:
        """The price of the run's model; PriceError (at start, before anything is sent) when unknown."""
        price = self.price(model)
        if price is not None:
            return price
        named = f"model {model!r}" if model is not None else \
            f"the model ({who}: its describe() names no model, and params has no \"model\")"
        raise PriceError(f"max_cost_usd is set, and {named} has no known price: genai-prices does not know "
                         f"it and the `prices` option does not name it. Give its price: "
                         f"prices={{{(model or ANY_MODEL)!r}: (input_per_mtok, output_per_mtok)}} (dollars per "
                         f"million tokens; \"*\" prices any model), or --prices FILE (TOML)")

    def record(self, used: Price | None) -> dict[str, Any]:
        """What the log header keeps, so replay and reconcile price the run as it was priced: the
        user's table, and the price resolved at start."""
        rates = {k: [v[0], v[1]] for k, v in self.table.items()}
        out: dict[str, Any] = {"table": rates}
        if used is not None:
            out["model"] = used.model
            out["rates"] = used.to_json()
        return out

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PriceBook:
        """A book from a header's record: the user's table, and the start price as if the user gave it."""
        table = load_prices(record.get("table") or {})
        rates, model = record.get("rates"), record.get("model")
        if isinstance(model, str) and isinstance(rates, list) and len(rates) >= 2 and model not in table:
            table[model] = _pair(model, rates[:2])
        return cls(table)


def price_book(prices: PricesArg) -> PriceBook:
    """`prices=` as run() takes it: None (genai-prices only), a mapping, or a TOML file's path."""
    return PriceBook(None if prices is None else load_prices(prices))
