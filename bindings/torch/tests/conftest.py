import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import torch  # noqa: F401
    import torch.distributed as dist

    HAVE_TORCH = dist.is_available()
except ImportError:
    HAVE_TORCH = False


def pytest_collection_modifyitems(config, items):
    if HAVE_TORCH:
        return
    skip = pytest.mark.skip(reason="torch (with torch.distributed) is not importable by this python: "
                                   "apt-get install python3-torch")
    for item in items:
        item.add_marker(skip)
