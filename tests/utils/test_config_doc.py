"""CONFIG.md lists every field of every settings model, and is regenerated from the code."""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from atroposlib.utils import config_doc


class _Example(BaseModel):
    """Example settings."""

    port: int = Field(default=8000, description="Port to listen on.")
    store: str | None = Field(default=None, description="Where | groups live.")
    mode: Literal["a", "b"] = "a"
    tags: list[str] = Field(default_factory=list, description="Tags.")
    name: str = Field(description="Required name.")


def test_every_field_is_a_row_with_type_default_and_description() -> None:
    text = config_doc.render_markdown([("Example", _Example, "--x.{name}")])
    rows = [line for line in text.splitlines() if line.startswith("| `--x.")]
    assert rows == [
        "| `--x.port` | int | `8000` | Port to listen on. |",
        "| `--x.store` | str \\| None | `None` | Where \\| groups live. |",
        "| `--x.mode` | 'a' \\| 'b' | `'a'` |  |",
        "| `--x.tags` | list[str] | `[]` | Tags. |",
        "| `--x.name` | str | required | Required name. |",
    ]
    assert "## Example" in text and "Example settings." in text


def test_committed_config_md_is_up_to_date() -> None:
    expected = config_doc.render_markdown(config_doc.documented_sections())
    committed = config_doc.config_md_path().read_text()
    assert committed == expected, (
        "CONFIG.md is out of date: run `python -m atroposlib.utils.config_doc > CONFIG.md`"
    )


class _Inner(BaseModel):
    clip_eps_high: float = Field(default=0.2, description="Upper clip.")
    enabled: bool = False


class _Outer(BaseModel):
    """Outer settings."""

    lr: float = Field(default=1e-6, description="Learning rate.")
    save_dir: Path = Field(default=Path("ckpt"), description="Where.")
    loss: _Inner = Field(default_factory=_Inner, description="Loss options.")


def test_nested_models_become_dotted_flags() -> None:
    text = config_doc.render_markdown([("Outer", _Outer, "--{name}")])
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    assert rows == [
        "| `--lr` | float | `1e-06` | Learning rate. |",
        "| `--save_dir` | Path | `'ckpt'` | Where. |",
        "| `--loss.clip_eps_high` | float | `0.2` | Upper clip. |",
        "| `--loss.enabled` | bool | `False` |  |",
    ]
