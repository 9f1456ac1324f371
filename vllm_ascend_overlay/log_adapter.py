"""Loggers for modules that must run without vLLM (the CPP maths, offline simulators, tests).

``get_logger(__name__)`` is vLLM's ``init_logger(__name__)`` when vLLM is importable, so a
record goes where every other vllm_ascend record goes; without vLLM it is the standard
library's logger of that name. Either way the module itself imports nothing of vLLM.
"""

from __future__ import annotations

import logging


def get_logger(name: str) -> logging.Logger:
    try:
        from vllm.logger import init_logger
    except ImportError:
        return logging.getLogger(name)
    return init_logger(name)
