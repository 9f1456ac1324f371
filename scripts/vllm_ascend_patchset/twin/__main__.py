"""``python -m vllm_ascend_patchset.twin``: the cpp-twin command (see ``command``)."""

import sys

from .command import main

sys.exit(main())
