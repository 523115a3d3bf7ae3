"""loopfence around the agents other frameworks run: the same guards, ledger and log as the ring.

    from loopfence.integrations.pydantic_ai import FenceCapability   # loopfence[pydantic-ai]

`Fence` (what to fence runs with), `FencedRun` (one run, driven by a framework's adapter) and
`FenceStop` (the exception that ends a framework's run, carrying the `Stop`) are framework-neutral:
importing this package imports no framework; each framework's module imports its own.
"""

from ._config import Fence
from ._fence import FencedRun, FenceStop

__all__ = ["Fence", "FencedRun", "FenceStop"]
