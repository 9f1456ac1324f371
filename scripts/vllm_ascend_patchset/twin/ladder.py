"""The 1-1.5-2 ladder of chunk sizes (32, 64, 96, 128, 192, ...) as CPP states it, for the twin's sweeps.

Read from the overlay's source (``core/cpp_ladder.py``, which imports nothing), so the
twin's sizes are CPP's without an assembled tree.
"""

from __future__ import annotations

from ..paths import OVERLAY_DIR
from ..trees import load_module_from_tree

__all__ = ["ladder"]

ladder = load_module_from_tree(OVERLAY_DIR.parent, f"{OVERLAY_DIR.name}.core.cpp_ladder").ladder
