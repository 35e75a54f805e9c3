"""TrainerConfig: precedence CLI > env > YAML > defaults, invariants, and the CLI's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.errors import ConfigError
from example_trainer.config import TrainerConfig, load_config


def test_defaults() -> None:
    cfg = load_config([])
    assert cfg.loss.advantage_std == "group" and cfg.weight_sync == "none" and cfg.lr == 1e-6


def test_precedence_cli_over_env_over_yaml_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(
        "lr: 0.001\nbatch_size: 8\nnum_steps: 7\nloss:\n  clip_eps_high: 0.28\n  kl_coef: 0.5\n"
    )
    monkeypatch.setenv("ATROPOS_TRAINER_BATCH_SIZE", "4")
    monkeypatch.setenv("ATROPOS_TRAINER_NUM_STEPS", "9")
    monkeypatch.setenv("ATROPOS_TRAINER_LOSS__KL_COEF", "0.1")
    cfg = load_config(["--config", str(yaml_file), "--num_steps", "11", "--loss.ratio", "sequence"])
    assert cfg.lr == 0.001  # YAML over default
    assert cfg.batch_size == 4  # env over YAML
    assert cfg.num_steps == 11  # CLI over env
    assert cfg.loss.kl_coef == 0.1  # nested env over nested YAML
    assert cfg.loss.clip_eps_high == 0.28 and cfg.loss.ratio == "sequence"  # nested merge
    assert cfg.max_token_len == TrainerConfig.model_fields["max_token_len"].default


URLS = ("--inference_urls", '["http://h:1"]')


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--weight_sync", "lora", *URLS], "set --lora.enabled"),
        (["--weight_sync", "disk"], "--inference_urls"),
        (["--micro_batch_tokens", "100"], "raise --micro_batch_tokens"),
        (["--loss.is_mask_low", "3"], "widen the bounds"),
        (["--warmup_steps", "200", "--num_steps", "100"], "lower --warmup_steps"),
        (
            [*("--parallel", "fsdp", "--lora.enabled", "--weight_sync", "disk"), *URLS],
            "use --parallel ddp or --weight_sync lora",
        ),
        (["--lr", "-1"], "--lr: input should be greater than 0, got '-1'"),
        (["--num_steps", "abc"], "--num_steps: input should be a valid integer, got 'abc'"),
        (["--bogus", "1"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_settings_name_the_fix(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as err:
        load_config(argv)
    assert "\n" not in str(err.value)


def test_missing_yaml_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(["--config", str(tmp_path / "nope.yaml")])


def test_cli_bad_flag_exits_2_with_one_line(subprocess_env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "example_trainer.train", "--loss.ratio", "bogus"]
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "loss.ratio" in done.stderr and "'token' or 'sequence'" in done.stderr


def test_broker_key_defaults_to_the_shared_key_and_is_never_dumped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ATROPOS_API_KEY", "shared-s3cret")
    cfg = load_config([])
    assert cfg.broker_api_key is not None
    assert cfg.broker_api_key.get_secret_value() == "shared-s3cret"
    assert "shared-s3cret" not in json.dumps(cfg.model_dump(mode="json")) + repr(cfg)
    monkeypatch.setenv("ATROPOS_TRAINER_BROKER_API_KEY", "own-key")
    own = load_config([]).broker_api_key
    assert own is not None and own.get_secret_value() == "own-key"
    flag = load_config(["--broker_api_key", "flag-key"]).broker_api_key
    assert flag is not None and flag.get_secret_value() == "flag-key"
    monkeypatch.delenv("ATROPOS_API_KEY")
    monkeypatch.delenv("ATROPOS_TRAINER_BROKER_API_KEY")
    assert load_config([]).broker_api_key is None
