"""On-policy distillation in the trainer: a student trained only on the per-token reverse KL
to a teacher's top-k distribution moves toward the teacher on held-out prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from trainer_helpers import ListClient, base_args, make_group

from atroposlib.errors import ConfigError
from example_trainer.config import load_config
from example_trainer.loss import distill_reverse_kl
from example_trainer.train import train

TOP_K = 64  # of 256 tokens: the tiny random model is flat, a real LM is not


def load(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@torch.no_grad()
def teacher_topk(teacher: Any, tokens: np.ndarray) -> tuple[list[list[int]], list[list[float]]]:
    """What a teacher server returns: per position the sampled token, then its top-k."""
    ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
    logp = torch.log_softmax(teacher(input_ids=ids).logits[0, :-1], -1)  # (L-1, V)
    top = logp.topk(TOP_K, dim=-1)
    out_ids, out_lp = [[]], [[]]
    for p in range(1, len(tokens)):
        own = int(tokens[p])
        others = [(i, v) for i, v in zip(top.indices[p - 1].tolist(), top.values[p - 1].tolist(),
                                         strict=True) if i != own][: TOP_K - 1]  # fmt: skip
        out_ids.append([own, *(i for i, _ in others)])
        out_lp.append([float(logp[p - 1, own]), *(v for _, v in others)])
    return out_ids, out_lp


def groups_with_teacher(teacher: Any, seed: int, n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    groups = [make_group(rng, [1.0, 0.0, 1.0, 0.0]) for _ in range(n)]
    for group in groups:
        pairs = [teacher_topk(teacher, tokens) for tokens in group["tokens"]]
        group["distill_token_ids"] = [ids for ids, _ in pairs]
        group["distill_logprobs"] = [lps for _, lps in pairs]
    return groups


@torch.no_grad()
def held_out_kl(student: Any, teacher: Any, groups: list[dict[str, Any]]) -> float:
    """Mean full-vocabulary KL(student || teacher) over the completion positions."""
    values = []
    for group in groups:
        for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
            ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
            s = torch.log_softmax(student(input_ids=ids).logits[0, :-1], -1)
            t = torch.log_softmax(teacher(input_ids=ids).logits[0, :-1], -1)
            kl = (s.exp() * (s - t)).sum(-1)  # (L-1,)
            trained = torch.as_tensor(np.asarray(masks)[1:] != -100)
            values.append(kl[trained])
    return float(torch.cat(values).mean())


def sharper_teacher(student: Path, folder: Path) -> Any:
    """The student with its output layer scaled 4x: a systematically sharper teacher, so what
    the student must learn holds on prompts it never saw."""
    teacher = load(student)
    with torch.no_grad():
        teacher.lm_head.weight.mul_(4.0)
    teacher.save_pretrained(folder)
    return teacher


@pytest.mark.slow
def test_distillation_alone_moves_the_student_toward_the_teacher(
    tiny_model: Path, tmp_path: Path
) -> None:
    teacher = sharper_teacher(tiny_model, tmp_path / "teacher")
    batches = {step: groups_with_teacher(teacher, seed=step, n=2) for step in range(1, 17)}
    held_out = groups_with_teacher(teacher, seed=99, n=4)  # different random prompts
    before = held_out_kl(load(tiny_model), teacher, held_out)
    args = base_args(tiny_model, tmp_path / "run", "--num-steps", "16", "--save-interval", "16",
                     "--micro-batching", "bucketed", "--lr", "2e-3", "--loss.distill-coef", "1.0",
                     "--loss.distill-only", "--no-loss.mask-zero-variance-groups")  # fmt: skip
    history = train(load_config(args), ListClient(batches.__getitem__))  # new prompts each step
    after = held_out_kl(load(tmp_path / "run" / "step-16"), teacher, held_out)
    print(f"held-out KL(student||teacher): {before:.4f} -> {after:.4f}; "
          f"train distill_kl {history[0]['train/distill_kl']:.4f} -> "
          f"{history[-1]['train/distill_kl']:.4f}")  # fmt: skip
    assert after < 0.85 * before  # measured: 0.114 -> 0.090 (-21 %)
    assert history[-1]["train/distill_kl"] < history[0]["train/distill_kl"]


def test_topk_reverse_kl_is_zero_at_the_teacher_and_positive_elsewhere() -> None:
    full_t = torch.log_softmax(torch.tensor([[[2.0, 1.0, 0.0, -1.0]]]), -1)  # (1, 1, V=4)
    full_s = torch.log_softmax(torch.tensor([[[0.0, 1.0, 2.0, 0.5]]]), -1)
    ids = torch.tensor([[[0, 1, 2]]])  # the teacher's top-3; token 3 is in "rest"
    valid = torch.ones(1, 1, 3, dtype=torch.bool)
    teacher, student = full_t.gather(-1, ids), full_s.gather(-1, ids)
    assert distill_reverse_kl(teacher, teacher, valid).item() == pytest.approx(0.0, abs=1e-6)
    full_kl = float((full_s.exp() * (full_s - full_t)).sum())
    coarse = distill_reverse_kl(student, teacher, valid).item()
    assert 0.5 < coarse <= full_kl + 1e-6  # a coarsening never exceeds the full KL
    one = valid.clone()
    one[..., 1:] = False  # only the sampled token known: still a proper (2-bucket) KL
    assert distill_reverse_kl(student, teacher, one).item() > 0.0


def test_distillation_needs_unpacked_micro_batches(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--micro-batching bucketed"):
        load_config(base_args(tiny_model, tmp_path, "--loss.distill-coef", "0.5"))
