"""Keyword typos, said the same way everywhere: `run() got an unknown keyword 'limts' (did you mean
'limits'?); it takes: ...`, naming what the user called (not a class behind it) and the nearest match.

`keywords_checked(fn_or_class)` wraps a public function (sync or async) or a class's `__init__`;
`unknown_keywords(called, given, valid)` is the check itself, for code that takes `**settings`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

__all__ = ["keywords_checked", "unknown_keywords"]

T = TypeVar("T")


def unknown_keywords(called: str, given: Iterable[str], valid: Sequence[str]) -> None:
    """TypeError for the first keyword in `given` that is not in `valid`, with the nearest valid one."""
    bad = [k for k in given if k not in valid]
    if not bad:
        return
    near = difflib.get_close_matches(bad[0], valid, n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    more = f" (and {', '.join(map(repr, bad[1:]))})" if len(bad) > 1 else ""
    raise TypeError(f"{called} got an unknown keyword {bad[0]!r}{hint}{more}; it takes: {', '.join(valid)}")


def keywords_checked(obj: T, *, extra: Sequence[str] = ()) -> T:
    """`obj` (a function, or a class whose `__init__` is wrapped in place) checking its keywords first.
    `extra`: the names a `**kwargs` parameter takes (a TypedDict's keys)."""
    if isinstance(obj, type):
        init = obj.__init__  # type: ignore[misc]
        obj.__init__ = _wrapped(init, f"{obj.__name__}()", extra)  # type: ignore[misc]
        return obj
    return _wrapped(obj, f"{getattr(obj, '__name__', 'it')}()", extra)  # type: ignore[arg-type, return-value]


def _wrapped(fn: Callable[..., Any], called: str, extra: Sequence[str]) -> Callable[..., Any]:
    params = inspect.signature(fn).parameters.values()
    valid = [*(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
               and not p.name.startswith("_")), *extra]
    if any(p.kind is p.VAR_KEYWORD for p in params) and not extra:
        return fn  # takes any keyword: nothing to check against

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def acall(*args: Any, **kwargs: Any) -> Any:
            unknown_keywords(called, kwargs, valid)
            return await fn(*args, **kwargs)
        return acall

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        unknown_keywords(called, kwargs, valid)
        return fn(*args, **kwargs)
    return call
