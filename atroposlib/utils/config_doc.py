"""Render settings models as Markdown tables: every field, type, default and description.

CONFIG.md is generated from the code by ``python -m atroposlib.utils.config_doc``; a test
fails when the committed file differs from what the code generates.
"""

from __future__ import annotations

import enum
import importlib
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# (section title, "module:Class", flag spelling: "{name}" or "{kebab}" stand for the field)
DOCUMENTED_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("Broker: `run-api`", "atroposlib.api.settings:BrokerSettings", "--{kebab}"),
    (
        "Environment: `python env.py serve|process|evaluate`",
        "atroposlib.envs.config:BaseEnvConfig",
        "--env.{name}",
    ),
    (
        "Inference server entries of an environment",
        "atroposlib.envs.server_handling.server_baseline:APIServerConfig",
        "--openai.{name}",
    ),
    ("SFT export: `atropos-sft-gen`", "atroposlib.export.settings:SftSettings", "--{kebab}"),
    ("DPO export: `atropos-dpo-gen`", "atroposlib.export.settings:DpoSettings", "--{kebab}"),
    ("Group browser: `view-run`", "atroposlib.cli.view_run:ViewRunSettings", "--{kebab}"),
    ("HTML report: `jsonl2html`", "atroposlib.cli.jsonl2html:Jsonl2HtmlSettings", "--{kebab}"),
    ("Trainer: `atropos-grpo`", "example_trainer.config:TrainerConfig", "--{kebab}"),
    (
        "Inference server: `atropos-inference`",
        "atroposlib.inference.settings:InferenceSettings",
        "--{kebab}",
    ),
    ("Local loop: `atropos-local`", "atroposlib.localrun.settings:LocalRunSettings", "--{kebab}"),
)

HEADER = """\
# Configuration reference

Generated from the settings models by `python -m atroposlib.utils.config_doc > CONFIG.md`;
do not edit by hand (a test fails when this file is out of date).

Flag spellings, one per command family: environments take Atropos's `--env.<field>` and
`--openai.<field>`; our own commands (`run-api`, `atropos-grpo`, `atropos-inference`,
`atropos-local` and the tools) take `--kebab-case`, nested settings `--loss.clip-eps-low`;
a name in capitals (`FILEPATH`) is a positional argument, typed without a flag.
`run-api` and `atropos-grpo` still accept their old `--snake_case` spellings for one release,
with a deprecation line on stderr. YAML keys and environment variables keep the field names
(`broker_url:`, `ATROPOS_TRAINER_BROKER_URL`). The broker's URL is `--broker-url` on the
trainer; Atropos's own names for it stay: `--env.rollout_server_url` and the tools' `--api-url`.
"""


def render_markdown(sections: Sequence[tuple[str, type[BaseModel], str]]) -> str:
    parts = [HEADER]
    for title, model, flag_pattern in sections:
        parts.append(f"\n## {title}\n\n`{model.__module__}.{model.__qualname__}`")
        doc = (model.__doc__ or "").strip().splitlines()
        if doc:
            parts.append(f" — {doc[0]}")
        parts.append("\n\n| flag | type | default | description |\n|---|---|---|---|\n")
        for name, info in _flat_fields(model):
            flag = flag_pattern.format(name=name, kebab=name.replace("_", "-"))
            if _positional(info):
                flag = name.upper()
            parts.append(
                f"| `{flag}` | {_escape(_type_name(info.annotation))} | "
                f"{_escape(_default(info))} | {_escape(info.description or '')} |\n"
            )
    return "".join(parts)


def _flat_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """Every field as (dotted name, info); a nested model's fields become ``outer.inner``."""
    rows: list[tuple[str, FieldInfo]] = []
    for name, info in model.model_fields.items():
        nested = info.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            rows.extend(_flat_fields(nested, f"{prefix}{name}."))
        else:
            rows.append((f"{prefix}{name}", info))
    return rows


def _positional(info: FieldInfo) -> bool:
    """A ``CliPositionalArg`` field: typed without a flag, shown as ``NAME``."""
    return any(getattr(marker, "__name__", "") == "_CliPositionalArg" for marker in info.metadata)


def documented_sections() -> list[tuple[str, type[BaseModel], str]]:
    sections = []
    for title, target, flag_pattern in DOCUMENTED_SETTINGS:
        module_name, class_name = target.split(":")
        model = getattr(importlib.import_module(module_name), class_name)
        sections.append((title, model, flag_pattern))
    return sections


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(repr(arg) for arg in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(repr(member.value) for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return f"`{info.default_factory()!r}`"  # type: ignore[call-arg]
    if info.default is PydanticUndefined:
        return "required"
    value = info.default.value if isinstance(info.default, enum.Enum) else info.default
    if isinstance(value, PurePath):
        value = str(value)
    return f"`{value!r}`"


def _escape(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|").replace("\\\\|", "\\|")


def main() -> None:
    sys.stdout.write(render_markdown(documented_sections()))


def config_md_path() -> Path:
    return Path(__file__).resolve().parents[2] / "CONFIG.md"


if __name__ == "__main__":
    main()
