"""`loopfence proxy`: the fence on the wire, in front of any OpenAI-compatible endpoint.

    from loopfence.proxy import Proxy, Settings
    app = Proxy("http://127.0.0.1:8080/v1", Settings(limits=Limits.profile("coding"), logs=Path("runs"))).app

Any agent that speaks Chat Completions and takes a base URL gets the same rules, stops and logs as
`loopfence.run()`, with no code change: see docs/proxy.md.
"""

from ._answer import RUN_HEADER, STOP_HEADER, STOP_MARKER, Answer
from ._app import SESSION_HEADERS
from ._proxy import Proxy, load_kinds
from ._runs import Settings
from ._wire import BadRequest

__all__ = ["Proxy", "Settings", "Answer", "BadRequest", "RUN_HEADER", "STOP_HEADER", "STOP_MARKER", "SESSION_HEADERS",
           "load_kinds"]
