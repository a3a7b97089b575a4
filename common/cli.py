"""What the project's command lines share: the name a usage line shows."""

from __future__ import annotations

import sys
from pathlib import Path


def program(module_form: str) -> str:
    """The command as it was run: an installed script's name (`subliminal-pipeline`), else `module_form`
    (`python jobs/pipeline.py`, `python -m train`), so a usage line shows a command that works."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("subliminal-") else module_form
