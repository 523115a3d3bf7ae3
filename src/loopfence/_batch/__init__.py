"""Batches of episodes: the local engine (`abatch`/`batch`), the episodes file, the results folder.

Above the loop and the drivers (it runs `arun()` and resumes from logs); see docs/ARCHITECTURE.md.
"""

from ._engine import BatchError, BatchResult, ModelSource, ToolSource, abatch, batch, read_job
from ._episodes import Episode, EpisodeError, load_episodes, parse_episodes
from ._results import EpisodeResult, ResultsFile, Summary, summarize

__all__ = ["BatchError", "BatchResult", "Episode", "EpisodeError", "EpisodeResult", "ModelSource",
           "ResultsFile", "Summary", "ToolSource", "abatch", "batch", "load_episodes", "parse_episodes",
           "read_job", "summarize"]
