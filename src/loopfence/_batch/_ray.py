"""The Ray backend (`loopfence[ray]`): fresh episode attempts run on Ray actors.

Each actor holds a copy of the batch's `Kit` and runs many episodes at once on its own event loop
(an async actor), each one `Kit.fresh` -> `arun`, exactly as the local engine runs it. The driver
keeps everything else: the folder, the workspace copies, recovery from logs, retries and the one
writer of results.jsonl. Logs are written by the actors straight into the batch folder, so it must be
a folder every node sees (a laptop's local Ray always does). An actor whose process dies is restarted
(up to `MAX_RESTARTS` times); the episodes it had in flight raise `WorkerLost` and get no row, and
`resume` continues them from their logs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

from ._episodes import Episode
from ._kit import Kit, WorkerLost
from ._results import EpisodeResult

__all__ = ["RayBackend", "RayUnavailable", "MAX_RESTARTS", "CANCEL_GRACE_S"]

MAX_RESTARTS = 3  # per actor; a worker that keeps dying is a broken job, not bad luck
CANCEL_GRACE_S = 10.0  # a cancelled episode's actor gets this long to write the `cancelled` stop


class RayUnavailable(ValueError):
    """Ray is not installed (`pip install 'loopfence[ray]'`) or cannot start or be reached."""


class _EpisodeActor:
    """One Ray actor: a Kit, and an event loop running its episodes (Ray's async actor loop)."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit

    async def fresh(self, ep: Episode, ws: Path | None, log: Path, attempts: int, folder: Path) -> EpisodeResult:
        return await self.kit.fresh(ep, ws, log, attempts, folder)

    def pid(self) -> int:
        return os.getpid()


class RayBackend:
    """Actors on a Ray cluster (started here when Ray is not running yet) and the dispatch to them."""

    def __init__(self, kit: Kit, *, address: str | None = None, workers: int | None = None,
                 init_options: dict[str, Any] | None = None) -> None:
        try:
            import ray
        except ImportError as exc:
            raise RayUnavailable(f"backend 'ray' needs loopfence[ray] (pip install 'loopfence[ray]'): {exc}") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            try:
                ray.init(address=address, include_dashboard=False, **(init_options or {}))
            except Exception as exc:  # noqa: BLE001 - whatever Ray says, one line
                raise RayUnavailable(f"cannot start or reach Ray{f' at {address}' if address else ''}: "
                                     f"{type(exc).__name__}: {exc}") from None
        if workers is not None and workers < 1:
            raise RayUnavailable(f"ray_workers must be at least 1, got {workers}")
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        actor = ray.remote(num_cpus=0, max_restarts=MAX_RESTARTS)(_EpisodeActor)
        try:
            self.actors = [actor.remote(kit) for _ in range(n)]
        except Exception as exc:  # noqa: BLE001 - e.g. a model or tool Ray cannot pickle
            self.close()
            raise RayUnavailable(f"the batch's model, tools and settings must be picklable to go to Ray "
                                 f"actors (give a model factory): {type(exc).__name__}: {exc}") from None
        self.turn = itertools.count()

    def pids(self) -> list[int]:
        """The actors' worker processes (what a test kills)."""
        return list(self.ray.get([a.pid.remote() for a in self.actors]))

    async def fresh(self, ep: Episode, ws: Path | None, log: Path, attempts: int, folder: Path) -> EpisodeResult:
        ref = self.actors[next(self.turn) % len(self.actors)].fresh.remote(ep, ws, log, attempts, folder)
        try:
            return await ref  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self.ray.cancel(ref)  # the actor's task is cancelled: the run writes its `cancelled` stop
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(ref.future())), CANCEL_GRACE_S)
            except BaseException:  # noqa: BLE001 - cancelled or gone: the log says what is left
                pass
            raise
        except self.ray.exceptions.RayActorError as exc:
            raise WorkerLost(f"episode {ep.id}: its Ray worker died: {exc}") from None

    def close(self) -> None:
        for a in getattr(self, "actors", ()):
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001,S110 - already gone
                pass
        self.actors = []
        if self.started:
            self.ray.shutdown()
