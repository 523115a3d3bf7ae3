"""Reading typed fields out of parsed JSON, with errors that name the file and the field path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from ..tools._jsonschema import json_type
from ._scenario import ScenarioError

__all__ = ["Fields", "json_type"]  # json_type: re-exported for the drill modules


@dataclass(frozen=True, slots=True)
class Fields:
    """One JSON object at `where` in `file`; every accessor checks the type it returns."""

    file: str
    where: str
    data: dict[str, Any]

    @classmethod
    def of(cls, file: str, where: str, value: Any) -> Fields:
        if not isinstance(value, dict):
            raise ScenarioError(file, where, f"must be an object, got {json_type(value)}")
        return cls(file, where, value)

    def path(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.where}[{key}]"
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str | int | None, problem: str) -> NoReturn:
        raise ScenarioError(self.file, self.where if key is None else self.path(key), problem)

    def only(self, allowed: tuple[str, ...] | list[str]) -> None:
        unknown = sorted(set(self.data) - set(allowed))
        if unknown:
            self.fail(unknown[0], f"unknown key (allowed here: {', '.join(allowed)})")

    def require(self, key: str) -> Any:
        if key not in self.data:
            self.fail(key, "missing required key")
        return self.data[key]

    def _typed(self, key: str, value: Any, want: str, ok: bool) -> Any:
        if not ok:
            self.fail(key, f"must be {want}, got {json_type(value)}")
        return value

    def string(self, key: str, default: str | None = None, *, required: bool = False,
               nonempty: bool = False) -> str | None:
        if key not in self.data and not required:
            return default
        value = self._typed(key, v := self.require(key), "a string", isinstance(v, str))
        if nonempty and not value.strip():
            self.fail(key, "must not be empty")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        if key not in self.data:
            return default
        v = self.data[key]
        return self._typed(key, v, "true or false", isinstance(v, bool))

    def count(self, key: str) -> int | None:
        """A whole number >= 0, or absent."""
        if key not in self.data:
            return None
        v = self.data[key]
        self._typed(key, v, "a whole number", isinstance(v, int) and not isinstance(v, bool))
        if v < 0:
            self.fail(key, f"must be >= 0, got {v}")
        return int(v)

    def number(self, key: str) -> float | None:
        if key not in self.data:
            return None
        v = self.data[key]
        self._typed(key, v, "a number", isinstance(v, (int, float)) and not isinstance(v, bool))
        if v < 0:
            self.fail(key, f"must be >= 0, got {v}")
        return float(v)

    def obj(self, key: str, *, required: bool = False) -> Fields | None:
        if key not in self.data and not required:
            return None
        return Fields.of(self.file, self.path(key), self.require(key))

    def array(self, key: str, *, required: bool = False, nonempty: bool = False) -> list[Any] | None:
        if key not in self.data and not required:
            return None
        value = self._typed(key, v := self.require(key), "an array", isinstance(v, list))
        if nonempty and not value:
            self.fail(key, "must not be empty")
        return value

    def strings(self, key: str) -> list[str]:
        items = self.array(key) or []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise ScenarioError(self.file, f"{self.path(key)}[{i}]",
                                    f"must be a string, got {json_type(item)}")
        return items

    def string_map(self, key: str) -> dict[str, str]:
        sub = self.obj(key)
        if sub is None:
            return {}
        for k, v in sub.data.items():
            if not isinstance(v, str):
                sub.fail(k, f"must be a string, got {json_type(v)}")
        return dict(sub.data)
