"""A pyinstrument flat profile (self time per file:function) of one loopfence overhead run (when pyinstrument is installed)."""

from __future__ import annotations

from types import ModuleType

from ..common import CAP, Workspace
from ..scripts import overhead_script

MAX_LINES = 25  # the functions with the most self time
# asyncio.run(arun(...)) with an async tool: the ring, the model and the tool all run on this thread
# (with a sync tool, each call runs on a worker thread, which a sampler of this thread would miss)
PROFILED = {"entry": "arun", "async_tools": True}


def loopfence_profile(fw: ModuleType, n: int) -> str | None:
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    with Workspace() as ws:
        go = fw.prepare(overhead_script(n), ws, cap=CAP, unbounded=True, **PROFILED)
        profiler = Profiler(interval=0.0005)  # samples this thread: the event loop the ring runs on
        profiler.start()
        try:
            go()
        finally:
            profiler.stop()
    text = profiler.output_text(unicode=False, color=False, flat=True, flat_time="self")
    lines = [line for line in text.splitlines() if line.strip()]
    body = [line for line in lines if not line.lstrip().startswith(("_", "/", "Recorded", "Program"))]
    return "\n".join(body[:MAX_LINES])
