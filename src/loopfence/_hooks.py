"""Run hooks: observers of every run started after they are added (`loopfence.instrument()`).

A hook is a factory, called once at the start of each run; it returns that run's `on_event`
callback (each typed event as it is written, header to stop) or None to sit the run out.
`with_run_hooks(on_event)` is what a run's start passes to its log: the caller's own callback
followed by each hook's; with no hook it is the caller's callback unchanged (nothing added to a
run nobody observes). Base layer: it imports nothing of loopfence at run time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._log._schema import LogEvent

__all__ = ["RunHook", "add_run_hook", "remove_run_hook", "run_hooks", "with_run_hooks"]

OnEvent = Callable[["LogEvent"], None]
RunHook = Callable[[], "OnEvent | None"]

_lock = threading.Lock()
_hooks: tuple[RunHook, ...] = ()


def add_run_hook(hook: RunHook) -> None:
    """Observe every run started from now on (added once; a second add changes nothing)."""
    global _hooks
    with _lock:
        if hook not in _hooks:
            _hooks = (*_hooks, hook)


def remove_run_hook(hook: RunHook) -> None:
    """Stop observing new runs (runs already started keep their callback to the end)."""
    global _hooks
    with _lock:
        _hooks = tuple(h for h in _hooks if h != hook)


def run_hooks() -> tuple[RunHook, ...]:
    return _hooks


def _made(hook: RunHook) -> OnEvent | None:
    """A hook's callback for this run; a hook that fails sits the run out (an observer never
    stops a run from starting)."""
    try:
        return hook()
    except Exception:  # noqa: BLE001
        return None


def with_run_hooks(*on_event: OnEvent | None) -> OnEvent | None:
    """The callback for one run starting now: each `on_event` given, then each hook's, in the order added."""
    callbacks = [cb for cb in (*on_event, *(_made(h) for h in _hooks)) if cb is not None]
    if not callbacks:
        return None
    if len(callbacks) == 1:
        return callbacks[0]

    def fan_out(event: LogEvent) -> None:
        for cb in callbacks:
            cb(event)

    return fan_out
