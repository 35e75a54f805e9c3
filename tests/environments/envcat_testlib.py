"""Run an environment's CLI for real against the scripted OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.inference import sample_log
from atroposlib.utils.health import wait_healthy
from example_trainer.config import LossConfig, load_config
from example_trainer.data import batch_to_samples, batch_totals
from example_trainer.loss import LossInputs, grpo_loss
from example_trainer.sequence_packing import micro_batch, micro_batch_plan, model_logprobs
from tests.fakes import PROCESS_START_TIMEOUT_S, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ENVIRONMENTS = REPO_ROOT / "environments"


def tokenizer_path() -> str:
    try:
        from atroposlib.utils.test_model import ensure_test_model

        return str(ensure_test_model())
    except ImportError:
        return str(Path.home() / ".cache/atroposlib/models/SmolLM2-135M-Instruct")


def child_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    }


class ScriptedServer:
    """``scripted_openai.py`` in its own process on a free port."""

    def __init__(self, rules: list[dict[str, Any]], tmp: Path) -> None:
        self.port = free_port()
        script = tmp / f"script-{self.port}.json"
        script.write_text(json.dumps(rules))
        self.log = (tmp / f"scripted-{self.port}.log").open("wb")
        args = [sys.executable, str(HERE / "scripted_openai.py"), "--port", str(self.port),
                "--script", str(script), "--tokenizer", tokenizer_path()]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"{self.url}/v1/models", timeout_s=PROCESS_START_TIMEOUT_S,
                         poll_s=0.1, process=self.proc, name="the scripted server")  # fmt: skip
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> list[dict[str, Any]]:
        return httpx.get(self.url + "/requests").json()  # type: ignore[no-any-return]

    def sampled(self) -> list[dict[str, Any]]:
        """Every sequence served token-in/token-out: ``{"prompt_ids", "output_ids"}``."""
        return httpx.get(self.url + "/sampled").json()  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def run_env(
    name: str, command: str, server: ScriptedServer, tmp: Path, *flags: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python environments/<name>/env.py <command> ...`` against ``server``."""
    args = [
        sys.executable, str(ENVIRONMENTS / name / "env.py"), command,
        f"--openai.base_url={server.url}/v1", "--openai.model_name=scripted",
        "--openai.api_key=x", f"--env.tokenizer_name={tokenizer_path()}", *flags,
    ]  # fmt: skip
    return subprocess.run(
        args, cwd=tmp, env=child_env(), capture_output=True, text=True, timeout=timeout
    )


def process_groups(
    name: str, server: ScriptedServer, tmp: Path, *flags: str, steps: int = 2
) -> list[dict[str, Any]]:
    """Run ``process`` for ``steps`` groups and return the groups it wrote; every sampled
    group is checked to be token-exact against what the server sampled."""
    out = tmp / f"{name}.jsonl"
    done = run_env(name, "process", server, tmp, f"--env.total_steps={steps}",
                   f"--env.data_path_to_save_groups={out}", *flags)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    sampled = [g for g in groups if not (g.get("group_overrides") or {}).get("sft")]
    assert_token_exact_groups(sampled, server.sampled())
    return groups


def load_env_module(name: str) -> Any:
    """Import ``environments/<name>/env.py`` as a module (its folder is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"envcat_{name}", ENVIRONMENTS / name / "env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class BrokerServer:
    """The real broker (``python -m atroposlib.api``, memory store) on a free port."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.log = (tmp / f"broker-{self.port}.log").open("wb")
        args = [sys.executable, "-m", "atroposlib.api", "--port", str(self.port), "--store",
                "memory"]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=child_env())  # fmt: skip
        try:
            wait_healthy(f"{self.url}/health", timeout_s=30, poll_s=0.1, process=self.proc,
                         name="the broker")  # fmt: skip
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def register_trainer(self, batch_size: int) -> None:
        body = {"wandb_group": "g", "wandb_project": "p", "batch_size": batch_size,
                "max_token_len": 2048, "checkpoint_dir": "ckpt", "save_checkpoint_interval": 0,
                "starting_step": 0, "num_steps": 100}  # fmt: skip
        httpx.post(self.url + "/register", json=body).raise_for_status()
        httpx.get(self.url + "/batch").raise_for_status()

    def pull_batches(
        self, count: int, env: subprocess.Popen[bytes], timeout: float = 120
    ) -> list[list[dict[str, Any]]]:
        """Take ``count`` batches, giving up when ``env`` exits first or after ``timeout``."""
        batches: list[list[dict[str, Any]]] = []
        deadline = time.monotonic() + timeout
        while len(batches) < count and time.monotonic() < deadline:
            exited = env.poll() is not None
            batch = httpx.get(self.url + "/batch", timeout=10).json()["batch"]
            if batch:
                batches.append(batch)
            elif exited:
                break
            else:
                time.sleep(0.1)
        return batches

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def serve_env(
    name: str, server: ScriptedServer, broker: BrokerServer, tmp: Path, *flags: str
) -> subprocess.Popen[bytes]:
    """``python environments/<name>/env.py serve ...`` in the background."""
    args = [
        sys.executable, str(ENVIRONMENTS / name / "env.py"), "serve",
        f"--openai.base_url={server.url}/v1", "--openai.model_name=scripted",
        "--openai.api_key=x", f"--env.tokenizer_name={tokenizer_path()}",
        f"--env.rollout_server_url={broker.url}", "--no-env.use_wandb", *flags,
    ]  # fmt: skip
    log = (tmp / f"serve-{name}.log").open("wb")
    return subprocess.Popen(args, cwd=tmp, env=child_env(), stdout=log, stderr=subprocess.STDOUT)


def chatml_messages(text: str) -> list[dict[str, str]]:
    """The messages of a decoded ChatML prompt (SmolLM2's template); the open generation
    prompt at its end is left out, so the chat reads as a chat completion request would."""
    messages = []
    for part in text.split("<|im_start|>")[1:]:
        role, _, content = part.partition("\n")
        if "<|im_end|>" in content:
            messages.append({"role": role, "content": content.split("<|im_end|>")[0]})
    return messages


class TokenFake:
    """In-process stand-in for ``self.server`` on the token path: ``choose(messages, i)`` picks
    each reply from the chat decoded out of the prompt ids; it records every sampled sequence."""

    returns_token_ids = True

    def __init__(self, choose: Any, tokenizer: Any) -> None:
        self.choose, self.tokenizer = choose, tokenizer
        self.calls = 0
        self.sampled: list[tuple[list[int], list[int]]] = []

    async def generate(self, input_ids: list[int], n: int, sampling: dict[str, Any]) -> list[Any]:
        from atroposlib.envs.server_handling.server_baseline import GeneratedSequence

        self.calls += 1
        chat = chatml_messages(self.tokenizer.decode(input_ids))
        out = []
        for i in range(n):
            text = self.choose(chat, i)
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), 2]
            self.sampled.append((list(input_ids), ids))
            out.append(GeneratedSequence(ids, [-0.5] * len(ids), "stop", text, 0))
        return out


def trained_spans(tokens: list[int], masks: list[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of trained positions (mask != -100)."""
    return sample_log.trained_spans(masks)


def assert_token_exact_groups(groups: list[dict[str, Any]], sampled: list[dict[str, Any]]) -> None:
    """Every trained span of every sequence is an output the server sampled, right after the
    exact prompt ids of that request; masks cover exactly those ids; logprobs are aligned."""
    served = {(tuple(s["prompt_ids"]), tuple(s["output_ids"])) for s in sampled}
    for group in groups:
        for index, (tokens, masks) in enumerate(zip(group["tokens"], group["masks"], strict=True)):
            spans = trained_spans(tokens, masks)
            for start, end in spans:
                assert masks[start:end] == tokens[start:end]
                key = (tuple(tokens[:start]), tuple(tokens[start:end]))
                assert key in served, f"sequence {index}: trained ids were not sampled from there"
            logprobs = (group.get("inference_logprobs") or [None] * len(tokens))[index]
            assert logprobs is not None and len(logprobs) == len(tokens)
            trained = {i for start, end in spans for i in range(start, end)}
            assert all(logprobs[i] == 1.0 for i in range(len(tokens)) if i not in trained)


# ---- in-process rollouts and the trainer's view of them ----------------------------------

MAX_TOKENS = 12


async def roll_out(
    name: str,
    base_url: str,
    model_name: str,
    model_path: Path,
    overrides: dict[str, Any],
    server_type: str = "embedded",
) -> list[dict[str, Any]]:
    """One item of env ``name``, in process, against the server at ``base_url``: the groups
    it would send (wire form), with a small group and short replies."""
    module = load_env_module(name)
    env_cls = next(
        c for c in vars(module).values() if isinstance(c, type) and getattr(c, "name", "") == name
    )
    config, _ = env_cls.config_init()
    settings = {
        "tokenizer_name": str(model_path), "group_size": 2, "use_wandb": False,
        "ensure_scores_are_not_same": False, "max_completion_tokens": MAX_TOKENS, **overrides,
    }  # fmt: skip
    if settings.get("data_path"):
        settings["data_path"] = str(Path(module.__file__).parent / settings["data_path"])
    config = config.model_copy(
        update={k: v for k, v in settings.items() if k in type(config).model_fields}
    )
    openai = APIServerConfig(base_url=base_url, model_name=model_name, server_type=server_type,
                             api_key="x")  # fmt: skip
    env = env_cls(config, [openai], slurm=False)
    try:
        await env.setup()
        item = await env.get_next_item()
        while name == "tool_calling" and len(item["turns"]) < 2:  # a multi-turn episode
            item = await env.get_next_item()
        return await env.run_item(item)
    finally:
        await env.server.close()


ADAPTERS = ["verifiers_single_turn", "verifiers_multi_turn", "verifiers_tool_use", "openenv"]


async def roll_out_adapter(
    name: str,
    base_url: str,
    model_name: str,
    model_path: Path,
    tmp: Path,
    server_type: str = "embedded",
) -> list[dict[str, Any]]:
    """One item of an adapter env (``docs/adapters.md``) in process against the server at
    ``base_url``; the verifiers test envs are packages in ``tmp`` (the caller puts ``tmp`` on
    ``PYTHONPATH`` for their tool server)."""
    from atroposlib.envs.adapters.openenv_env import OpenEnvConfig, OpenEnvEnv
    from atroposlib.envs.adapters.verifiers_env import VerifiersEnv, VerifiersEnvConfig
    from tests.envs.adapters_testlib import GUESS_SERVER, import_vf_env, write_vf_envs

    write_vf_envs(tmp)
    settings: dict[str, Any] = {
        "tokenizer_name": str(model_path), "group_size": 2, "use_wandb": False,
        "ensure_scores_are_not_same": False, "max_token_length": 512, "max_completion_tokens": 10,
    }  # fmt: skip
    openai = [APIServerConfig(base_url=base_url, model_name=model_name, server_type=server_type,
                              api_key="x")]  # fmt: skip
    env: VerifiersEnv | OpenEnvEnv
    if name.startswith("verifiers"):
        vf_env = {"verifiers_single_turn": "vf_sum", "verifiers_multi_turn": "vf_say",
                  "verifiers_tool_use": "vf_add"}[name]  # fmt: skip
        import_vf_env(tmp, vf_env)
        env = VerifiersEnv(VerifiersEnvConfig(vf_env=vf_env, **settings), openai)
    else:
        command = f"{sys.executable} {GUESS_SERVER} --port {{port}}"
        env = OpenEnvEnv(OpenEnvConfig(openenv_command=command, **settings), openai)
    try:
        await env.setup()
        return await env.run_item(await env.get_next_item())
    finally:
        await env.close()


def trainer_deltas(groups: list[dict[str, Any]], model: Any) -> tuple[float, dict[str, float]]:
    """Max |trainer - inference| logprob over trained tokens, and the loss's IS metrics."""
    cfg = load_config(["--model", "unused", "--batch-size", "64", "--max-token-len", "4096",
                       "--micro-batch-tokens", "8192"])  # fmt: skip
    loss_cfg = LossConfig(
        behavior_logprobs="inference", is_correction="tis", mask_zero_variance_groups=False
    )
    samples, _, _ = batch_to_samples(groups, loss_cfg)
    samples = [s for s in samples if s.trained_tokens > 0]
    totals = batch_totals(samples)
    plan = micro_batch_plan(cfg, samples)
    worst, sums = 0.0, {"is_weight": 0.0, "rl_tokens": 0.0, "mismatch_kl": 0.0}
    with torch.no_grad():
        for planned in plan.entries:
            mb = micro_batch(cfg, samples, planned)
            logp, entropy = model_logprobs(model, mb)
            trained = mb.mask > 0
            worst = max(worst, float((logp - mb.inference_logprobs)[trained].abs().max()))
            x = LossInputs(logp=logp, entropy=entropy, mask=mb.mask, advantages=mb.advantages,
                           sft=mb.sft, inference_logp=mb.inference_logprobs,
                           has_inference=mb.has_inference)  # fmt: skip
            _, metrics = grpo_loss(x, loss_cfg, totals, 1)
            for key in sums:
                sums[key] += float(metrics[key])
    return worst, sums
