"""The bench scripts (bench/*.py) are scripts, not a package: tests load one by its path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str) -> ModuleType:
    """bench/NAME.py as a module (its ``main`` not run)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
