"""Built-in workspace tools. Names and signatures are public: scenario files and users rely on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._registry import Tool, tool

__all__ = ["workspace_tools", "PAGE_CHARS"]

PAGE_CHARS = 4_000


def workspace_tools(root: str | Path, names: list[str] | None = None) -> list[Tool]:
    """The built-in file tools bound to one workspace folder."""
    base = Path(root).resolve()

    def _resolve(path: str) -> Path | dict[str, Any]:
        target = (base / path).resolve()
        if not path or (target != base and base not in target.parents):
            return {"ok": False, "error": "path_outside_workspace", "path": path}
        if not target.exists():
            return {"ok": False, "error": "missing_file", "path": path, "cwd": str(base),
                    "hint": "do_not_retry_same_path"}
        return target

    def read_file(path: str, page: int = 1, encoding: str = "utf-8") -> Any:
        """Read one page of a text file in the workspace."""
        target = _resolve(path)
        if isinstance(target, dict):
            return target
        text = target.read_text(encoding=encoding)
        pages = max(1, -(-len(text) // PAGE_CHARS))
        if page < 1 or page > pages:
            return {"ok": False, "error": "page_out_of_range", "path": path, "pages": pages}
        chunk = text[(page - 1) * PAGE_CHARS: page * PAGE_CHARS]
        marker = f"[page {page} of {pages}: end of file]" if page == pages else \
            f"[page {page} of {pages}: call read_file with page={page + 1} for more]"
        return f"{chunk}\n{marker}"

    def list_dir(path: str = ".") -> Any:
        """List a folder in the workspace (folders end with /)."""
        target = _resolve(path)
        if isinstance(target, dict):
            return target
        return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir()))

    made = [tool(read_file, kind="read_only"), tool(list_dir, kind="read_only")]
    return [t for t in made if names is None or t.name in names]
