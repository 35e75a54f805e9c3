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
    cfg = load_config(["--config", str(yaml_file), "--num-steps", "11", "--loss.ratio", "sequence"])
    assert cfg.lr == 0.001  # YAML over default
    assert cfg.batch_size == 4  # env over YAML
    assert cfg.num_steps == 11  # CLI over env
    assert cfg.loss.kl_coef == 0.1  # nested env over nested YAML
    assert cfg.loss.clip_eps_high == 0.28 and cfg.loss.ratio == "sequence"  # nested merge
    assert cfg.max_token_len == TrainerConfig.model_fields["max_token_len"].default


URLS = ("--inference-urls", '["http://h:1"]')


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--weight-sync", "lora", *URLS], "set --lora.enabled"),
        (["--weight-sync", "disk"], "--inference-urls"),
        (["--micro-batch-tokens", "100"], "raise --micro-batch-tokens"),
        (["--loss.is-mask-low", "3"], "widen the bounds"),
        (["--warmup-steps", "200", "--num-steps", "100"], "lower --warmup-steps"),
        (
            [*("--parallel", "fsdp", "--lora.enabled", "--weight-sync", "disk"), *URLS],
            "use --parallel ddp or --weight-sync lora",
        ),
        (["--lr", "-1"], "--lr: input should be greater than 0, got '-1'"),
        (["--num-steps", "abc"], "--num-steps: input should be a valid integer, got 'abc'"),
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


def test_old_snake_case_flags_still_work_with_one_deprecation_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = ["--broker_url", "http://old:8000", "--loss.clip_eps_high=0.28",
           "--no-trained_logits_only", "--batch-size", "8"]  # fmt: skip
    cfg = load_config(old)
    assert cfg.broker_url == "http://old:8000" and cfg.batch_size == 8
    assert cfg.loss.clip_eps_high == 0.28 and cfg.trained_logits_only is False
    assert capsys.readouterr().err.splitlines() == [
        "atropos-grpo: warning: --broker_url is deprecated, use --broker-url "
        "(the old spelling goes in a later release)",
        "atropos-grpo: warning: --loss.clip_eps_high is deprecated, use --loss.clip-eps-high "
        "(the old spelling goes in a later release)",
        "atropos-grpo: warning: --no-trained_logits_only is deprecated, use "
        "--no-trained-logits-only (the old spelling goes in a later release)",
    ]
    assert load_config(["--broker-url", "http://new:8000"]).broker_url == "http://new:8000"
    assert capsys.readouterr().err == ""
    # a flag that never existed is refused as typed, without a deprecation line
    with pytest.raises(ConfigError, match=r"unrecognized arguments: --loss\.clip_eps_hi"):
        load_config(["--loss.clip_eps_hi", "0.3"])
    assert capsys.readouterr().err == ""


def test_help_shows_only_the_kebab_spelling(subprocess_env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "example_trainer.train", "--help"]
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert "--broker-url" in done.stdout and "--loss.clip-eps-high" in done.stdout
    assert "--broker_url" not in done.stdout and "clip_eps_high" not in done.stdout


def test_cli_old_spelling_with_a_bad_value_warns_then_fails_on_one_line(
    subprocess_env: dict[str, str],
) -> None:
    cmd = [sys.executable, "-m", "example_trainer.train", "--num_steps", "abc"]
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "atropos-grpo: warning: --num_steps is deprecated, use --num-steps "
        "(the old spelling goes in a later release)",
        "atropos-grpo: error: --num-steps: input should be a valid integer, got 'abc'",
    ]


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
    flag = load_config(["--broker-api-key", "flag-key"]).broker_api_key
    assert flag is not None and flag.get_secret_value() == "flag-key"
    monkeypatch.delenv("ATROPOS_API_KEY")
    monkeypatch.delenv("ATROPOS_TRAINER_BROKER_API_KEY")
    assert load_config([]).broker_api_key is None


def test_the_trainer_sends_the_admin_key_to_broker_and_inference_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Registering, batches, acks and weight pushes are admin routes; without an admin key the
    servers take their run key for them, and so does the trainer."""
    monkeypatch.setenv("ATROPOS_API_KEY", "run-key")
    monkeypatch.setenv("ATROPOS_ADMIN_API_KEY", "admin-key")
    cfg = load_config([])
    assert cfg.broker_api_key is not None and cfg.inference_api_key is not None
    assert cfg.broker_api_key.get_secret_value() == "admin-key"
    assert cfg.inference_api_key.get_secret_value() == "admin-key"
    assert "admin-key" not in json.dumps(cfg.model_dump(mode="json")) + repr(cfg)
    monkeypatch.delenv("ATROPOS_ADMIN_API_KEY")
    cfg = load_config([])
    assert cfg.broker_api_key is not None and cfg.inference_api_key is not None
    assert cfg.broker_api_key.get_secret_value() == "run-key"
    assert cfg.inference_api_key.get_secret_value() == "run-key"


def test_the_default_vllm_restart_command_is_loopback_behind_the_guard_with_no_key() -> None:
    argv = load_config([]).vllm_command.split()
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--middleware") + 1] == "atroposlib.vllm_plugin.guard.VllmGuard"
    assert not any("key" in arg.lower() for arg in argv)
