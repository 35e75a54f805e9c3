"""Fixtures for the trainer tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from trainer_helpers import tiny_llama


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer Llama (hidden 64, vocab 256) saved as an HF folder."""
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "model")
