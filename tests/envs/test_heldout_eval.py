"""What atropos-local's held-out evaluation asks of any env (``atroposlib.envs.heldout_eval``),
checked against the reader (``atroposlib.localrun.report``) and on the guide's env."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from atroposlib.cli.local import eval_failure
from atroposlib.envs.cli import build_env, parse_settings
from atroposlib.envs.heldout import Disjointness
from atroposlib.envs.heldout_eval import graded_sample, held_out_metrics
from atroposlib.localrun import report
from tests.fakes import CharTokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_addition() -> ModuleType:
    path = REPO_ROOT / "environments" / "addition" / "env.py"
    spec = importlib.util.spec_from_file_location("guide_addition_env", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


addition = load_addition()


def right_if(answer: str) -> object:
    return lambda reply: reply == answer


def write(folder: Path, rows: list[dict], disjointness: Disjointness) -> None:
    folder.mkdir()
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = held_out_metrics(rows, disjointness)
    (folder / "metrics.json").write_text(json.dumps({"results": {"all": metrics}}))


def test_graded_samples_are_what_atropos_local_compares(tmp_path: Path) -> None:
    check = Disjointness(2, 1500, 0, 0.1)
    before = [graded_sample("1+2", "1 + 2?", "3", right_if("3")),  # right, no tag
              graded_sample("2+2", "2 + 2?", "<answer>5</answer>", right_if("4"))]  # fmt: skip
    after = [graded_sample("1+2", "1 + 2?", "<answer>3</answer>", right_if("3")),
             graded_sample("2+2", "2 + 2?", "<answer>4</answer>", right_if("4"))]  # fmt: skip
    write(tmp_path / "before", before, check)
    write(tmp_path / "after", after, check)
    comparison = report.compare_evals(tmp_path / "before", tmp_path / "after")
    assert comparison is not None and comparison.problems == 2
    assert (comparison.strict.before, comparison.strict.after) == (0.0, 1.0)
    assert comparison.strict.wrong_to_right == 2
    assert (comparison.lenient.before, comparison.lenient.wrong_to_right) == (0.5, 1)
    assert (comparison.format_before, comparison.format_after) == (0.5, 1.0)
    assert (comparison.overlap_with_training_pool, comparison.training_pool_problems) == (0, 1500)


def test_held_out_metrics_refuse_an_empty_evaluation() -> None:
    with pytest.raises(ValueError, match="no held-out samples"):
        held_out_metrics([], Disjointness(0, 10, 0, 0.1))


def test_an_env_without_eval_size_is_told_the_fix() -> None:
    tail = "error: unrecognized arguments: --env.eval_size 4 (see --help)"
    message = eval_failure("eval-before", 2, tail)
    assert message.startswith(f"eval-before exited with code 2:\n{tail}")
    assert "HeldOutEvalConfig" in message and "--eval-size 0" in message
    assert eval_failure("eval-before", 1, "boom") == "eval-before exited with code 1:\nboom"


def test_the_guide_env_takes_the_flags_atropos_local_passes(tmp_path: Path) -> None:
    argv = ["--env.eval_size", "7", "--env.data_dir_to_save_evals", str(tmp_path)]
    settings = parse_settings(addition.AdditionEnv, "evaluate", argv, environ={})
    assert (settings.env.eval_size, settings.env.data_dir_to_save_evals) == (7, str(tmp_path))


async def test_the_guide_env_holds_out_problems_training_never_draws() -> None:
    settings = parse_settings(addition.AdditionEnv, "serve", ["--env.eval_size=100"], environ={})
    env = build_env(addition.AdditionEnv, settings)
    await env.setup()
    held_out = {addition.key(p) for p in env.held_out}
    assert len(env.held_out) == len(held_out) == 100
    assert addition.key(addition.EXAMPLE) not in held_out
    drawn = {addition.key(await env.get_next_item()) for _ in range(3000)}
    assert not held_out & drawn and len(drawn) > 1000
    assert (env.disjointness.eval_problems, env.disjointness.overlap) == (100, 0)
    env.tokenizer = CharTokenizer()
    sampler = env.token_sampler()  # the config's max_completion_tokens and temperature
    assert (sampler.max_tokens, sampler.temperature) == (24, 1.0)


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("<answer>47</answer>", 1.1),  # right and well formed
        ("The sum: <answer>47</answer>", 1.0),  # right, extra text: no format credit
        ("<answer>46</answer>", 0.1),  # wrong, well formed
        ("47", 0.0),  # right, no tag
        ("<think><answer>47</answer></think>", 0.0),  # the answer hidden in a think block
    ],
)
def test_the_guide_env_reward_table(reply: str, score: float) -> None:
    assert addition.reward(reply, (12, 35), 0.1) == pytest.approx(score)
