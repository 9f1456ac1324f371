"""Which wheel: a CPython tag and a machine, the key of every pinned wheel and assembled tree."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class WheelTarget:
    """One wheel flavour: CPython tag (``cp311``) and machine (``x86_64``)."""

    py: str
    arch: str

    @property
    def name(self) -> str:
        return f"{self.py}-{self.arch}"

    @property
    def platform_tag(self) -> str:
        return f"manylinux_2_34_{self.arch}"

    @classmethod
    def host(cls) -> WheelTarget:
        return cls(f"cp{sys.version_info.major}{sys.version_info.minor}", platform.machine())
