"""The environment in docs/writing-an-environment.md is the one the tests run."""

from __future__ import annotations

import re

from envs_testlib import EXAMPLE_ENV, REPO_ROOT


def test_the_documented_example_is_the_tested_example() -> None:
    page = (REPO_ROOT / "docs" / "writing-an-environment.md").read_text()
    first_block = re.search(r"```python\n(.*?)```", page, re.DOTALL)
    assert first_block is not None
    assert first_block.group(1) == EXAMPLE_ENV.read_text()
