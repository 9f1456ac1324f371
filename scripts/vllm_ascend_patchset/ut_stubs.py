"""pytest plugin for upstream's unit tests (``upstream_ut.py``): stand-ins for what the test
environment lacks and upstream's CPU runner has.

``torchvision``: upstream's patches import vLLM's multimodal models, which import it at
module level; no test of the CPU runner's that touches this series runs a vision model, so
every ``torchvision`` module is a ``MagicMock`` (as upstream's ``conftest.py`` does for
``torch_npu``). A real ``torchvision`` wins when installed.
"""

from __future__ import annotations

import importlib.util
import sys
from unittest.mock import MagicMock


class _StandIn:
    """A meta-path finder that makes ``torchvision`` and its submodules mocks."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        module = MagicMock(name=spec.name)
        module.__spec__, module.__path__, module.__name__ = spec, [], spec.name
        return module

    def exec_module(self, module):
        return None


if importlib.util.find_spec("torchvision") is None:
    sys.meta_path.append(_StandIn())
