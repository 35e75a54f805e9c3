"""The trainer on the device: one GRPO step per micro-batching mode, LoRA, FSDP2 on one rank.

Every step goes through the trainer's own code (``build_trainee``, ``optimizer_step``).

- bf16 vs fp32: the same first step, from the same weights, on a batch whose old-policy
  logprobs are the fp32 model's own plus noise (std 0.1) and whose advantages are all 1, so the
  loss is about -mean(ratio): |loss_bf16 - loss_fp32| / |loss_fp32| <= 2e-2 (bf16 keeps ~3
  significant digits per token logprob; the mean over thousands of tokens averages them) and
  the gradient norms within 5 %.
- The three modes lay the same sequences out differently; in fp32 their losses agree to 1e-4
  (relative; float reassociation only).
- Timing: a warm-up step, then one timed bf16 step on the timed batch. MFU = model FLOPs /
  (step time x the card's dense bf16 peak), with model FLOPs = 6 x (body parameters x tokens
  laid into rows + vocabulary x hidden x logit rows) + 6 x layers x hidden x sum(length^2)
  (attention; a shared prompt counted once, as computed).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
import torch

from atroposlib.localrun.components import free_port
from example_trainer.config import TrainerConfig, load_config
from example_trainer.train import optimizer_step
from example_trainer.trainee import Trainee, build_trainee
from gpu_check import batches, shapes
from gpu_check.context import Context

MODES = ("packed", "prefix_shared", "bucketed")
LOSS_REL_BOUND = 2e-2
GRAD_REL_BOUND = 5e-2
MODES_REL_BOUND = 1e-4


def config(ctx: Context, model: Any, **overrides: Any) -> TrainerConfig:
    settings: dict[str, Any] = {
        "model": str(model),
        "save_dir": ctx.work / "checkpoints",
        "max_token_len": 2048,
        "micro_batch_tokens": 16384 if ctx.gpu else 2048,
        "lr": 1e-5,
        "batch_size": 256,
    }
    return load_config([], **{**settings, **overrides})


def sampled_replies(ctx: Context, model_dir: Any, groups: list[dict[str, Any]]) -> None:
    """Replace each reply by one the fp32 model samples (T = 1, the same length), as an env's
    replies are, and set inference_logprobs to the model's own plus noise (std 0.1).

    Random ids would sit at logprobs near -20, where bf16's absolute error is ten times a
    sampled token's and the PPO clip turns it into a different gradient."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = model.to(ctx.device).eval()
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    with torch.no_grad():
        for group in groups:
            prompt_len = int((np.asarray(group["masks"][0]) == -100).sum())
            prompt = torch.as_tensor(np.asarray(group["tokens"][0][:prompt_len], np.int64))
            lengths = [len(seq) - prompt_len for seq in group["tokens"]]
            out = model.generate(  # one batch per group: its replies share the prompt
                prompt.to(ctx.device)[None], do_sample=True, temperature=1.0, top_k=0,
                max_new_tokens=max(lengths), min_new_tokens=max(lengths),
                num_return_sequences=len(lengths),
            )  # fmt: skip
            rows, tokens = [], []
            for full, new in zip(out, lengths, strict=True):
                full = full[: prompt_len + new]
                logp = torch.log_softmax(model(input_ids=full[None]).logits[0, :-1].float(), -1)
                row = np.zeros(len(full), np.float32)
                row[1:] = logp.gather(-1, full[1:, None])[:, 0].cpu().numpy()
                tokens.append(full.cpu().numpy().astype(np.int32))
                rows.append(row + rng.normal(0.0, 0.1, size=len(full)).astype(np.float32))
            group["tokens"] = tokens
            group["masks"] = [np.where(np.arange(len(t)) < prompt_len, -100, t) for t in tokens]
            group["inference_logprobs"] = rows
    del model


def model_flops(run: Trainee, cfg: TrainerConfig, done: Any) -> float:
    inner: Any = run.model
    body = shapes.body_parameters(inner)
    config = inner.config
    vocab_hidden = config.vocab_size * config.hidden_size
    laid = done.plan.tokens
    logit_rows = done.trained_tokens if cfg.micro_batching != "bucketed" else laid
    attention = config.num_hidden_layers * config.hidden_size * sum(n * n for n in done.lengths)
    return 6.0 * (body * laid + vocab_hidden * logit_rows + attention)


def step_once(
    ctx: Context, cfg: TrainerConfig, groups: list[dict[str, Any]], run: Trainee | None = None
) -> tuple[Trainee, Any]:
    run = run or build_trainee(cfg, None, torch.device(ctx.device), 1)
    return run, optimizer_step(cfg, run, copy.deepcopy(groups), {}, 1, torch.device(ctx.device))


VARIANTS = {
    "fp32": {"precision": "fp32"},
    "bf16": {"precision": "bf16"},
    "bf16_fp32_logits": {"precision": "bf16", "fp32_logits": True},
}


def compare_precisions(
    ctx: Context, model_dir: Any, mode: str, compared: list[dict[str, Any]], variants: list[str]
) -> tuple[Trainee, float]:
    """bf16 (and its variants) vs fp32 on the compared batch; returns the last trainee (bf16)
    and the fp32 loss."""
    losses, norms = {}, {}
    run: Trainee | None = None
    for variant in variants:
        run = None  # the previous trainee's memory back before the next one loads
        cfg = config(ctx, model_dir, micro_batching=mode, loss={"behavior_logprobs": "inference"},
                     **VARIANTS[variant])  # fmt: skip
        run, done = step_once(ctx, cfg, compared)
        losses[variant], norms[variant] = done.sums["loss"], done.grad_norm
        ctx.result.add(**{f"{mode}/loss_{variant}": losses[variant],
                          f"{mode}/grad_norm_{variant}": norms[variant]})  # fmt: skip
    for variant in variants[1:]:
        loss_rel = abs(losses[variant] - losses["fp32"]) / abs(losses["fp32"])
        grad_rel = abs(norms[variant] - norms["fp32"]) / norms["fp32"]
        ctx.result.check(f"{mode}: {variant} loss vs fp32", loss_rel <= LOSS_REL_BOUND,
                         loss_rel, f"relative <= {LOSS_REL_BOUND}")  # fmt: skip
        ctx.result.check(f"{mode}: {variant} grad norm vs fp32", grad_rel <= GRAD_REL_BOUND,
                         grad_rel, f"relative <= {GRAD_REL_BOUND}")  # fmt: skip
    assert run is not None
    return run, losses["fp32"]


def timed_step(ctx: Context, run: Trainee, cfg: TrainerConfig, label: str) -> None:
    timed = batches.make_groups(batches.TIMED[ctx.device], run.model.config.vocab_size, seed=2)
    step_once(ctx, cfg, timed, run)  # warm-up: kernels for these shapes
    ctx.reset_peak_memory()
    with ctx.timed() as seconds:
        _, done = step_once(ctx, cfg, timed, run)
    tokens = batches.sequence_tokens(timed)
    flops = model_flops(run, cfg, done)
    peak = ctx.peak()
    ctx.result.add(**{
        f"{label}/step_s": seconds[0],
        f"{label}/sequences": sum(len(g["tokens"]) for g in timed),
        f"{label}/tokens": tokens,
        f"{label}/tokens_per_s": tokens / seconds[0],
        f"{label}/tflops": flops / seconds[0] / 1e12,
        f"{label}/mfu": flops / seconds[0] / (peak * 1e12) if peak else None,
        f"{label}/peak_memory_gib": ctx.peak_memory_gib(),
    })  # fmt: skip
    ctx.result.check(f"{label}: timed step loss finite", np.isfinite(done.sums["loss"]),
                     done.sums["loss"], "finite")  # fmt: skip


def modes(ctx: Context, shape: str = "qwen2.5-0.5b-like", modes: tuple[str, ...] = MODES) -> None:
    """Per mode: bf16 vs fp32 on the compared batch, then a timed bf16 step."""
    model_dir = ctx.model(shape)
    ctx.result.add(model=shape if ctx.gpu else "tiny", device_name=device_name(ctx))
    vocab_size = vocabulary(model_dir)
    compared = batches.make_groups(
        batches.COMPARED[ctx.device], vocab_size, 1, unit_advantages=True
    )
    sampled_replies(ctx, model_dir, compared)
    fp32_losses = {}
    for mode in modes:
        variants = ["fp32", "bf16_fp32_logits", "bf16"] if mode == "packed" else ["fp32", "bf16"]
        run, fp32_losses[mode] = compare_precisions(ctx, model_dir, mode, compared, variants)
        label = f"{shape}/{mode}" if ctx.gpu else mode
        timed_step(ctx, run, config(ctx, model_dir, micro_batching=mode, precision="bf16"), label)
        if mode == "packed":
            cfg = config(ctx, model_dir, micro_batching=mode, **VARIANTS["bf16_fp32_logits"])
            timed_step(ctx, run, cfg, f"{label}_fp32_logits")
        if mode == "prefix_shared" and ctx.gpu:  # trees in rows of 4096, not the budget's
            cfg = config(ctx, model_dir, micro_batching=mode, precision="bf16",
                         pack_row_tokens=4096)  # fmt: skip
            timed_step(ctx, run, cfg, f"{label}_rows4096")
        del run
        if ctx.gpu:
            torch.cuda.empty_cache()
    first = fp32_losses[modes[0]]
    spread = max(abs(v - first) / abs(first) for v in fp32_losses.values())
    ctx.result.check("fp32 loss equal across modes", spread <= MODES_REL_BOUND, spread,
                     f"relative <= {MODES_REL_BOUND}")  # fmt: skip


def lora(ctx: Context) -> None:
    """A LoRA step: adapters move, the base weights do not."""
    model_dir = ctx.model("qwen2.5-0.5b-like")
    cfg = config(ctx, model_dir, precision="bf16", lora={"enabled": True})
    run = build_trainee(cfg, None, torch.device(ctx.device), 1)
    named = dict(run.model.named_parameters())
    base_name = next(n for n in named if "q_proj.base_layer.weight" in n)
    lora_name = next(n for n in named if "q_proj.lora_B" in n)
    base_before = named[base_name].detach().clone()
    lora_before = named[lora_name].detach().clone()
    timed_step(ctx, run, cfg, "lora")
    base_moved = float((named[base_name] - base_before).abs().max())
    lora_moved = float((named[lora_name] - lora_before).abs().max())
    trainable = sum(p.numel() for p in run.params)
    ctx.result.add(lora_trainable_parameters=trainable)
    ctx.result.check("lora: base weights unchanged", base_moved == 0.0, base_moved, "== 0")
    ctx.result.check("lora: adapters moved", lora_moved > 0.0, lora_moved, "> 0")


def fsdp2(ctx: Context) -> None:
    """FSDP2 on one rank (the code path: sharding, gradient sync switch, full-state gather)
    against the same step unsharded, fp32."""
    from example_trainer.checkpoint import gather_full_state
    from example_trainer.distributed import init_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1",
                      RANK="0", LOCAL_RANK="0")  # fmt: skip
    init_distributed()
    model_dir = ctx.model("qwen2.5-0.5b-like")
    groups = batches.make_groups(batches.COMPARED[ctx.device], vocabulary(model_dir), 3)
    found = {}
    for parallel in ("ddp", "fsdp"):
        cfg = config(ctx, model_dir, precision="fp32", parallel=parallel)
        run, done = step_once(ctx, cfg, groups)
        found[parallel] = (done.sums["loss"], done.grad_norm, run.sharded)
        if parallel == "fsdp":
            state = gather_full_state(run.model, run.optimizer, run.sharded)
            ctx.result.add(fsdp_gathered_tensors=len(state.model))
        del run
    loss_rel = abs(found["fsdp"][0] - found["ddp"][0]) / abs(found["ddp"][0])
    grad_rel = abs(found["fsdp"][1] - found["ddp"][1]) / found["ddp"][1]
    ctx.result.add(fsdp_loss=found["fsdp"][0], plain_loss=found["ddp"][0])
    ctx.result.check("fsdp2: the model is sharded", found["fsdp"][2], found["fsdp"][2], "True")
    ctx.result.check("fsdp2: loss vs unsharded", loss_rel <= 1e-5, loss_rel, "relative <= 1e-5")
    ctx.result.check("fsdp2: grad norm vs unsharded", grad_rel <= 1e-4, grad_rel,
                     "relative <= 1e-4")  # fmt: skip
    torch.distributed.destroy_process_group()


def vocabulary(model_dir: Any) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(str(model_dir)).vocab_size)


def device_name(ctx: Context) -> str:
    return torch.cuda.get_device_name() if ctx.gpu else "cpu"
