"""``eval_runner`` (Atropos's stand-alone evaluation entry): its flags, defaults and errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atroposlib.envs.eval import EvalBase, eval_runner
from atroposlib.envs.server_handling.server_manager import ServerManager


class CountingEval(EvalBase):
    """Scores each item as itself and records the server it was given."""

    def setup_data(self) -> list[Any]:
        return [1.0, 2.0]

    async def run_item(self, server: ServerManager, data_item: Any) -> tuple[dict[str, Any], Any]:
        self.seen = server.servers[0].config
        return {"score": data_item}, {"item": data_item}


def test_flags_reach_the_server_config() -> None:
    env = CountingEval(verbose=False)
    argv = ["--server-url", "http://infer:9001/v1", "--model-name", "m"]
    assert asyncio.run(eval_runner(env, argv)) == {"score": 1.5}
    assert (env.seen.base_url, env.seen.model_name) == ("http://infer:9001/v1", "m")


def test_defaults() -> None:
    env = CountingEval(verbose=False)
    asyncio.run(eval_runner(env, []))
    assert (env.seen.base_url, env.seen.model_name) == ("http://localhost:8000", "default")


def test_a_bad_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        asyncio.run(eval_runner(CountingEval(verbose=False), ["--server_url", "x"]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments: --server_url" in err[0], err
