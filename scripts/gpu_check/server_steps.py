"""The embedded server on the device: sampled logprobs vs the trainer's, throughput, weight pushes.

- logprobs: the server samples (``POST /generate``, T = 0.7, token ids and logprobs back); the
  trainer's packed forward (its ``model_logprobs``, logits / temperature) scores the same
  tokens at the same weights. fp32 (server ``--dtype float32``, trainer fp32): max |delta| <=
  1e-3, the bound the vLLM tier asserts; bf16 (server bf16 weights, trainer bf16 autocast over
  fp32 copies of the same values): reported, mean |delta| <= 0.1 (a wrong position, cache or
  temperature gives errors of order 1).
- throughput: the demo's mix (benchmarks/inference_compare.py: 16-sample groups of a ~200-token
  prompt, 64-256 new tokens) and 64 concurrent sequences of 256 new tokens.
- weight push: the trainer's own push (``push_to_inference``) into the running server, through
  each transport the server offers (``shm`` and ``http`` in flight, ``disk`` reload): seconds
  per push (the second of two; the first warms up), and the served weights' checksums equal to
  what the trainer sent (``sync_verify checksum``), the version read back.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from atroposlib.inference.engine import resolve_dtype
from atroposlib.inference.weight_transfer import checksums
from atroposlib.launcher import Component, Supervisor
from atroposlib.localrun.components import free_port
from benchmarks.inference_compare import MIXES, Mix, TreeMonitor, run_mix
from example_trainer.data import batch_to_samples
from example_trainer.inflight.tensors import hf_tensors
from example_trainer.publish import push_to_inference
from example_trainer.sequence_packing import micro_batch, model_logprobs
from example_trainer.trainee import autocast, build_trainee, load_model
from example_trainer.weight_sync import sync_for
from gpu_check import trainer_steps
from gpu_check.context import Context

TEMPERATURE = 0.7
FP32_BOUND = 1e-3
BF16_MEAN_BOUND = 0.1
QUESTIONS = ("Calculate 46 + 37.", "Why is the sky blue?", "Name three prime numbers.",
             "What is a group in algebra?")  # fmt: skip
MIX64 = Mix("concurrent64", clients=64, requests=1, n=1, temperature=1.0,
            new_tokens=(256, 256), demo_prompt=False)  # fmt: skip
CPU_MIX = Mix("demo_small", clients=2, requests=1, n=4, temperature=1.0, new_tokens=(16, 32),
              demo_prompt=True)  # fmt: skip
"""On CPU (the tiny model, CI): the demo's prompts, fewer and shorter replies."""


@contextmanager
def embedded_server(ctx: Context, model: Path, dtype: str, label: str) -> Iterator[tuple[str, int]]:
    """(url, pid) of an embedded server on the device, stopped on leaving."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "atroposlib.inference", "--model", str(model),
            "--device", ctx.device, "--dtype", dtype, "--port", str(port),
            "--served-model-name", "default", "--weight-roots", str(ctx.work)]  # fmt: skip
    with Supervisor(ctx.work / f"server-{label}") as supervisor:
        supervisor.start(Component("inference", argv, health_url=f"{url}/health",
                                   startup_timeout_s=300.0))  # fmt: skip
        yield url, supervisor.pids()["inference"]


def sample(url: str, tokenizer: Any, new_tokens: int) -> list[dict[str, Any]]:
    """Groups (prompt + reply token ids, masks, the server's logprobs) from ``/generate``."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in QUESTIONS
    ]
    prompts = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    body = {"input_ids": prompts, "return_logprob": True,
            "sampling_params": {"n": 4, "temperature": TEMPERATURE, "max_new_tokens": new_tokens,
                                "ignore_eos": True}}  # fmt: skip
    response = httpx.post(f"{url}/generate", json=body, timeout=300.0)
    if not response.is_success:
        raise RuntimeError(f"/generate answered {response.status_code}: {response.text[:300]}")
    answers = response.json()
    groups = []
    for index, prompt in enumerate(prompts):
        tokens, masks, server_lp = [], [], []
        for answer in answers[index * 4 : (index + 1) * 4]:
            out = answer["output_ids"]
            tokens.append(prompt + out)
            masks.append([-100] * len(prompt) + out)
            server_lp.append([lp for lp, _, _ in answer["meta_info"]["output_token_logprobs"]])
        groups.append({"tokens": tokens, "masks": masks, "scores": [0.0, 1.0, 0.0, 1.0],
                       "generation_params": {"temperature": TEMPERATURE},
                       "server_logprobs": server_lp})  # fmt: skip
    return groups


def trainer_logprobs(ctx: Context, model_dir: Path, precision: str, groups: list[dict]) -> list:
    """Each reply token's logprob from the trainer's packed forward, one sequence a row."""
    cfg = trainer_steps.config(ctx, model_dir, precision=precision)
    model = load_model(cfg, None, torch.device(ctx.device)).eval()
    samples, _, _ = batch_to_samples(groups, cfg.loss, {})
    out = []
    with torch.no_grad():
        for sample in samples:
            mb = micro_batch(cfg, [sample], [[0]]).to(torch.device(ctx.device))
            with autocast(cfg, torch.device(ctx.device)):
                logp, _ = model_logprobs(model, mb)
            out.append(logp[0][mb.mask[0] > 0].float().cpu().numpy())
    return out


def logprobs(ctx: Context) -> None:
    from transformers import AutoTokenizer

    model_dir = ctx.model("qwen2.5-0.5b-like")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    for dtype, precision in (("float32", "fp32"), ("bfloat16", "bf16")):
        with embedded_server(ctx, model_dir, dtype, precision) as (url, _):
            groups = sample(url, tokenizer, 64 if ctx.gpu else 16)
        ours = trainer_logprobs(ctx, model_dir, precision, groups)
        served = [np.asarray(lp) for g in groups for lp in g["server_logprobs"]]
        deltas = np.concatenate([np.abs(a - b) for a, b in zip(ours, served, strict=True)])
        ctx.result.add(**{f"{precision}/max_abs_delta": deltas.max(),
                          f"{precision}/mean_abs_delta": deltas.mean(),
                          f"{precision}/tokens": deltas.size})  # fmt: skip
        if precision == "fp32":
            ctx.result.check("fp32: server vs trainer logprobs", deltas.max() <= FP32_BOUND,
                             deltas.max(), f"max |delta| <= {FP32_BOUND}")  # fmt: skip
        else:
            ctx.result.check("bf16: server vs trainer logprobs", deltas.mean() <= BF16_MEAN_BOUND,
                             deltas.mean(), f"mean |delta| <= {BF16_MEAN_BOUND}")  # fmt: skip


def throughput(ctx: Context) -> None:
    model_dir = ctx.model("qwen2.5-0.5b-like")
    mixes = [MIXES["demo"], MIX64] if ctx.gpu else [CPU_MIX]
    with embedded_server(ctx, model_dir, "auto", "throughput") as (url, pid):
        for mix in mixes:
            monitor = TreeMonitor(pid)
            try:
                found = asyncio.run(run_mix(url, "default", mix, monitor))
            finally:
                monitor.stop()
            ctx.result.add(**{f"{mix.name}/tokens_per_s": found.tokens_per_s,
                              f"{mix.name}/tokens": found.tokens,
                              f"{mix.name}/p50_latency_s": found.latency(0.5),
                              f"{mix.name}/p99_latency_s": found.latency(0.99)})  # fmt: skip
            ctx.result.check(f"{mix.name}: tokens generated", found.tokens > 0, found.tokens, "> 0")


def weight_push(ctx: Context) -> None:
    model_dir = ctx.model("qwen2.5-0.5b-like")
    run = build_trainee(trainer_steps.config(ctx, model_dir), None, torch.device(ctx.device), 1)
    with embedded_server(ctx, model_dir, "auto", "push") as (url, _):
        for transport in ("shm", "http", "disk"):
            live = transport != "disk"
            cfg = trainer_steps.config(
                ctx, model_dir, weight_sync="embedded" if live else "disk",
                sync_transport=transport if live else "auto", inference_urls=[url],
                sync_verify="checksum", save_dir=ctx.work / f"push-{transport}",
            )  # fmt: skip
            sync = sync_for(cfg)
            seconds = []
            for step in (1, 2):
                with torch.no_grad():  # new weights, so a stale copy cannot pass the checksum
                    next(p for p in run.params).add_(1e-3)
                with ctx.timed() as took:
                    _, failed = push_to_inference(cfg, run, sync, step, None, 0, 1)
                seconds.append(took[0])
                ctx.result.check(f"{transport}: push {step} served and verified", failed is None,
                                 str(failed or "ok"), "no failure")  # fmt: skip
            version = httpx.get(f"{url}/health").json().get("weight_version")
            match = served_matches(url, run, ctx.device)
            ctx.result.check(f"{transport}: served checksums equal the trainer's", match,
                             match, "True")  # fmt: skip
            ctx.result.add(**{f"{transport}/push_s": seconds[-1],
                              f"{transport}/first_push_s": seconds[0]})  # fmt: skip
            ctx.result.check(f"{transport}: version read back", str(version) == "2", version, "2")
            sync.close()


def served_matches(url: str, run: Any, device: str) -> bool:
    """Do the server's weights hash like the trainer's, in the served dtype?"""
    served_dtype = resolve_dtype("auto", device)
    with hf_tensors(run.model, None) as tensors:
        baseline = checksums({name: t.to(served_dtype) for name, t in tensors()})
    body = {"action": "compare", "baseline": baseline}
    answer = httpx.post(f"{url}/weight_checker", json=body, timeout=300.0).raise_for_status()
    return bool(answer.json()["match"])
