"""What a command needs beyond `pip install 'retrain[cli]'`, said in one line instead of a traceback.

The annotators' commands (`validate`, `data`, `runs`, `link`) run on the base dependencies and the
`cli` extra; the offline stack (`local`) needs `retrain[local]` (moto, cheroot, ...), and drawing
or training scenes (`synth`, `train`, `report`) `retrain[trainer]` (numpy, torch). Each such
command calls `require` before it imports any of them.
"""

from __future__ import annotations

import importlib.util
import sys

import typer
from rich.console import Console

# The modules of each extra that the commands import (pyproject.toml lists the distributions).
EXTRAS: dict[str, tuple[str, ...]] = {
    "local": ("moto", "werkzeug", "cheroot", "psutil", "packaging"),
    "trainer": ("numpy", "torch"),
}


def missing(modules: tuple[str, ...]) -> list[str]:
    """Those of `modules` that cannot be imported here (found without importing them)."""
    absent = []
    for name in modules:
        if name in sys.modules:
            if sys.modules[name] is None:  # how tests, and `python -X`, block an import
                absent.append(name)
            continue
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            absent.append(name)
    return absent


def require(extra: str, command: str, modules: tuple[str, ...] | None = None) -> None:
    """Exit 2 with one line naming the extra to install when `extra`'s modules (or `modules`) are missing."""
    absent = missing(modules if modules is not None else EXTRAS[extra])
    if absent:
        Console(stderr=True, highlight=False).print(
            f"error: `retrain {command}` needs the {extra} extra ({', '.join(absent)} not installed): "
            f"pip install 'retrain[{extra}]'",
            soft_wrap=True,
            markup=False,
        )
        raise typer.Exit(2)
