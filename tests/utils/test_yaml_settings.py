"""The shared ``--config`` YAML layer: reading the file, and the precedence of the sources."""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from atroposlib.errors import ConfigError
from atroposlib.utils import yaml_settings
from atroposlib.utils.yaml_settings import LayeredSettings, read_yaml_config, yaml_layer


class Knobs(LayeredSettings):
    model_config = SettingsConfigDict(env_prefix="KNOBS_TEST_", extra="forbid")

    a: int = Field(1, description="First knob.")
    b: int = Field(2, description="Second knob.")
    c: int = Field(3, description="Third knob.")


class MergedKnobs(Knobs):
    sources_merged_by_caller: ClassVar[bool] = True


def test_doctests() -> None:
    assert doctest.testmod(yaml_settings).failed == 0


def test_precedence_init_over_environment_over_yaml_over_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KNOBS_TEST_A", "20")
    monkeypatch.setenv("KNOBS_TEST_B", "20")
    with yaml_layer({"a": 30, "b": 30, "c": 30}):
        knobs = Knobs(a=10)
    assert (knobs.a, knobs.b, knobs.c) == (10, 20, 30)
    assert Knobs().c == 3  # outside the block the YAML layer is gone


def test_merged_by_caller_reads_init_kwargs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBS_TEST_A", "20")
    with yaml_layer({"b": 30}):
        knobs = MergedKnobs()
    assert (knobs.a, knobs.b) == (1, 2)


@pytest.mark.parametrize(
    ("text", "keys", "message"),
    [
        (None, None, "does not exist; pass an existing YAML file"),
        ("a: [1, 2", None, "is not valid YAML"),
        ("- 1\n- 2\n", None, "must hold a mapping of settings"),
        ("- 1\n", ("env", "openai"), "must hold a mapping with keys env, openai"),
        ("env: {}\nservers: []\n", ("env", "openai"), "unknown top-level keys ['servers']"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_flag(
    tmp_path: Path, text: str | None, keys: tuple[str, ...] | None, message: str
) -> None:
    path = tmp_path / "run.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_yaml_config(path, keys=keys)
    assert str(err.value).startswith("--config: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_an_empty_file_is_no_settings(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    assert read_yaml_config(path) == {}
