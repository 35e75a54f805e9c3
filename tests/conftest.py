"""Fixtures shared by every test area."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def test_model_path() -> Path:
    """The real small chat model (SmolLM2-135M-Instruct) as a transformers folder."""
    from atroposlib.utils.test_model import ensure_test_model

    return ensure_test_model()


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """Environment for child processes: this checkout's source first on the path."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep + path if path else ''}"}
