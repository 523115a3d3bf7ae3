"""What the CLI tests share."""

from __future__ import annotations

import subprocess


def drill_file_error(p: subprocess.CompletedProcess[str]) -> str:
    """A bad scenario file is an error row while the others run: exit 2, one error line naming it."""
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("loopfence drill: error: ")]
    assert len(errors) == 1, p.stderr
    return errors[0]
