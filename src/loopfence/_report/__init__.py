"""`loopfence report`: self-contained HTML pages (inline CSS, script and SVG; no network) for a run
log or a batch / drill folder."""

from ._dir import DirView, read_dir, render_dir, write_dir_report
from ._run import RunView, read_run, render_run, write_run_report

__all__ = ["DirView", "RunView", "read_dir", "read_run", "render_dir", "render_run", "write_dir_report",
           "write_run_report"]
