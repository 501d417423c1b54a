"""Shared test fixtures. Tests run on CPU; multi-device checks run in subprocesses with their own XLA_FLAGS."""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"  # math sets carried in the repository (data/README.md); tests fail, not skip, without them


@pytest.fixture
def python_exe() -> str:
    return sys.executable
