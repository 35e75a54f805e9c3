"""Every YAML in configs/ parses through the real settings class of its component.

Broker YAMLs go through ``run-api``'s flag parser, trainer YAMLs through
``example_trainer.config.load_config`` and environment YAMLs through the env CLI of the
environment they name. A class that is not in this checkout yet (the trainer, an
environment) is replaced by the checks that need no class, and the test says which.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from atroposlib.api.settings import BrokerSettings
from atroposlib.cli import run_api
from atroposlib.cli.slurm_plan import broker_flags
from atroposlib.envs.base import BaseEnv
from atroposlib.envs.cli import parse_settings
from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.server_handling.server_baseline import APIServerConfig

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
# Env YAMLs not named env-<name>.yaml say here which environment they configure.
ENV_SCRIPT_OF = {
    "local-cpu-env.yaml": "environments/reasoning_gym/env.py",
    "local-cpu-three-sums-env.yaml": "environments/reasoning_gym/env.py",
}
TRAINER_URLS = ["--inference-urls", '["http://placeholder:9000"]']  # the sbatch script adds them


def kind_of(path: Path) -> str:
    if path.name == "broker.yaml":
        return "broker"
    if path.name.endswith("trainer.yaml"):
        return "trainer"
    if path.name.startswith("env-") or path.name.endswith("-env.yaml"):
        return "env"
    raise AssertionError(f"{path}: name it broker.yaml, *trainer.yaml, env-<name>.yaml")


def env_script_of(path: Path) -> Path:
    if path.name in ENV_SCRIPT_OF:
        return REPO / ENV_SCRIPT_OF[path.name]
    return REPO / "environments" / path.stem.removeprefix("env-") / "env.py"


def load_env_class(script: Path) -> type[BaseEnv]:
    name = f"_config_test_{script.parent.name}"
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    classes = [
        value for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, BaseEnv) and value is not BaseEnv
        and value.__module__ == name
    ]  # fmt: skip
    assert len(classes) == 1, f"{script}: expected one BaseEnv subclass, found {classes}"
    return classes[0]


def trainer_loader() -> Any:
    if importlib.util.find_spec("example_trainer") is None:
        return None
    from example_trainer.config import load_config

    return load_config


def validate_broker(path: Path) -> BrokerSettings:
    data = yaml.safe_load(path.read_text())
    unknown = set(data) - set(BrokerSettings.model_fields)
    assert not unknown, f"{path}: unknown broker settings {sorted(unknown)}"
    return run_api.parse_settings(broker_flags(path))


def unknown_keys(model: type[BaseModel], data: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys of ``data`` that ``model`` has no field for, nested models included.

    Nested pydantic models ignore extra keys by default, so a typo such as
    ``loss.clip_eps_hi`` would pass the class itself silently.
    """
    found = []
    for key, value in data.items():
        info = model.model_fields.get(key)
        if info is None:
            found.append(prefix + key)
        elif isinstance(value, dict):
            nested = info.annotation
            if isinstance(nested, type) and issubclass(nested, BaseModel):
                found += unknown_keys(nested, value, f"{prefix}{key}.")
    return found


def validate_trainer(path: Path) -> Any:
    load_config = trainer_loader()
    if load_config is None:  # trainer not merged into this checkout yet
        data = yaml.safe_load(path.read_text())
        assert isinstance(data, dict) and data, f"{path}: expected a mapping of trainer settings"
        return data
    config = load_config(["--config", str(path), *TRAINER_URLS])
    unknown = unknown_keys(type(config), yaml.safe_load(path.read_text()))
    assert not unknown, f"{path}: unknown trainer settings {unknown}"
    return config


def validate_env(path: Path) -> Any:
    data = yaml.safe_load(path.read_text())
    servers = data.get("openai") or []
    for server in servers if isinstance(servers, list) else [servers]:
        unknown = set(server) - set(APIServerConfig.model_fields)
        assert not unknown, f"{path}: unknown openai settings {sorted(unknown)}"
        APIServerConfig.model_validate(server)
    script = env_script_of(path)
    if script.is_file():
        return parse_settings(load_env_class(script), "serve", ["--config", str(path)], environ={})
    # The environment is not in this checkout yet: check what BaseEnvConfig knows.
    assert set(data) <= {"env", "openai"}, f"{path}: top-level keys must be env and openai"
    base = {k: v for k, v in data["env"].items() if k in BaseEnvConfig.model_fields}
    return BaseEnvConfig.model_validate(base)


VALIDATORS = {"broker": validate_broker, "trainer": validate_trainer, "env": validate_env}


def test_configs_folder_has_every_kind_of_run() -> None:
    names = {str(path.relative_to(REPO / "configs")) for path in CONFIGS}
    for expected in (
        "local-cpu-env.yaml",
        "gsm8k-1gpu/trainer.yaml",
        "multi-node/broker.yaml",
        "multi-env-1node/env-code_execution.yaml",
        "slurm-cpu-trial/trainer.yaml",
    ):
        assert expected in names  # fmt: skip


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_config_parses_through_its_settings_class(path: Path) -> None:
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    text = " ".join(header)
    assert header and all(word in text for word in ("What it runs", "Hardware", "Expect")), (
        f"{path}: start with comment lines saying What it runs, Hardware and Expect"
    )
    assert VALIDATORS[kind_of(path)](path) is not None


def test_multi_env_config_sets_weights_and_minimum_shares() -> None:
    folder = REPO / "configs" / "multi-env-1node"
    envs = {p.stem: yaml.safe_load(p.read_text())["env"] for p in folder.glob("env-*.yaml")}
    assert set(envs) == {"env-math", "env-code_execution", "env-tool_calling"}
    assert envs["env-code_execution"]["min_batch_allocation"] == 0.2
    assert sum(env.get("min_batch_allocation") or 0 for env in envs.values()) < 1


def test_unknown_fields_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broker = tmp_path / "broker.yaml"
    broker.write_text("log_level: info\nmax_queue_groups: 5\n")
    with pytest.raises(AssertionError, match="max_queue_groups"):
        validate_broker(broker)
    broker.write_text("log_level: loud\n")
    with pytest.raises(SystemExit) as exit_info:
        validate_broker(broker)
    assert exit_info.value.code == 2
    env = tmp_path / "local-cpu-env.yaml"
    env.write_text("env:\n  group_size: 4\n  group_sizes: 8\nopenai:\n  model_name: m\n")
    script = env_script_of(env)
    if script.is_file():
        with pytest.raises(SystemExit):
            validate_env(env)
        assert "group_sizes" in capsys.readouterr().err
    env.write_text("env:\n  group_size: 4\nopenai:\n  model_nam: m\n")
    with pytest.raises(AssertionError, match="model_nam"):
        validate_env(env)
    if trainer_loader() is not None:
        from atroposlib.errors import ConfigError

        trainer = tmp_path / "trainer.yaml"
        trainer.write_text("batch_size: 8\nloss:\n  clip_eps_hi: 0.3\n")
        # the trainer itself refuses a misspelt nested option
        with pytest.raises(ConfigError, match=r"loss\.clip_eps_hi"):
            validate_trainer(trainer)
        trainer.write_text("batch_size: 8\nlearning_rate: 0.1\n")
        with pytest.raises(ConfigError, match="learning_rate"):
            validate_trainer(trainer)
