"""Prefix sharing: a group's prompt computed once, and the same loss as packed micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from trainer_helpers import MIXED_LOSSES, VOCAB, make_group

from atroposlib.errors import ConfigError
from example_trainer.config import LossConfig, TrainerConfig, load_config
from example_trainer.data import Sample, batch_to_samples, batch_totals
from example_trainer.loss import LossInputs, grpo_loss
from example_trainer.prefix_sharing import Tree, collate_trees, plan_trees, shareable
from example_trainer.sequence_packing import micro_batch, micro_batch_plan, model_logprobs


def load(path: Path, attn: str = "sdpa") -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.config._attn_implementation = attn
    return model


def tree_batch(seed: int = 0) -> list[dict[str, Any]]:
    """Groups sharing their prompts, with every shape prefix sharing must get right."""
    rng = np.random.default_rng(seed)
    temps = [{"temperature": 0.7}, {}, {"temperature": 1.3}, {}]
    groups = {
        "long_prompt": make_group(
            rng, [0.0, 1.0, 1.0, 0.0], 20, [5, 9, 3, 7], True,
            overrides=temps, generation_params={"temperature": 0.9},
        ),
        "one_token_reply": make_group(rng, [1.0, 0.0, 0.5], 9, [4, 12, 1], True),
        "partial": make_group(rng, [0.0, 1.0, 1.0], 14, [6, 2, 8], True),
        "alone": make_group(rng, [1.0, 0.0], 7, [5, 10]),  # two prompts: no partner each
        "sft": make_group(rng, [1.0, 1.0], 6, [10, 4], True, group_overrides={"sft": True}),
        "multi_turn": make_group(rng, [1.0, 0.0], 10, [15, 15], True),
    }  # fmt: skip
    for k, t in enumerate(groups["partial"]["tokens"][1:], start=1):
        t[8] = (groups["partial"]["tokens"][0][8] + k) % (VOCAB - 1) + 1  # agree on 8 of 14
    for m in groups["multi_turn"]["masks"]:
        m[15:21] = -100  # a second prompt turn between two trained replies
    for first, group in enumerate(groups.values(), start=1):  # no prompt shares a first token
        for t in group["tokens"]:
            t[0] = first
    groups["alone"]["tokens"][1][0] = 99
    for group in groups.values():
        group["ref_logprobs"] = [-rng.uniform(2.0, 6.0, size=len(t)) for t in group["tokens"]]
    return list(groups.values())


def samples_of(loss: LossConfig | None = None) -> list[Sample]:
    samples, _, _ = batch_to_samples(tree_batch(), loss or LossConfig())
    assert all(s.trained_tokens > 0 for s in samples)
    return samples


def trainer_config(mode: str, loss: LossConfig | None = None, budget: int = 96) -> TrainerConfig:
    argv = [
        "--model",
        "unused",
        "--max-token-len",
        str(budget),
        "--micro-batch-tokens",
        str(budget),
    ]
    return load_config([*argv, "--micro-batching", mode], loss=loss or LossConfig())


def members(entry: list[list[Any]]) -> list[int]:
    """Sample indices of a planned micro-batch in its rows' order (packed ints or trees)."""
    return [
        i
        for row in entry
        for item in row
        for i in (item.members if isinstance(item, Tree) else (item,))
    ]


# ---- the trees ------------------------------------------------------------------------------


def test_trees_share_exactly_the_common_prompt() -> None:
    samples = samples_of()
    trees = plan_trees(samples, max_tokens=64)
    assert sorted(i for tree in trees for i in tree.members) == list(range(len(samples)))
    got = sorted((tree.prefix, len(tree.members)) for tree in trees)
    # long prompt, one-token replies, partial (8 of its 14), two singletons, SFT, multi-turn
    assert got == [(6, 2), (7, 1), (7, 1), (8, 3), (9, 3), (10, 2), (20, 4)]
    for tree in trees:
        head = samples[tree.members[0]].tokens[: tree.prefix]
        for i in tree.members:
            assert np.array_equal(samples[i].tokens[: tree.prefix], head)
            assert tree.prefix <= shareable(samples[i]) < len(samples[i].tokens)
        lengths = [len(samples[i].tokens) for i in tree.members]
        assert tree.tokens == tree.prefix + sum(n - tree.prefix for n in lengths)


@pytest.mark.parametrize(
    ("max_tokens", "expected"),
    [
        (200, [(20, 4)]),  # the whole group: 20 + 4 x 10 = 60 tokens
        (45, [(20, 2), (20, 2)]),  # three members (50) do not fit: two pairs
        (29, [(20, 1)] * 4),  # a pair (40) does not fit: each alone
    ],
)
def test_a_tree_is_split_to_fit_the_row(max_tokens: int, expected: list[tuple[int, int]]) -> None:
    group = make_group(np.random.default_rng(3), [0.0, 1.0, 1.0, 0.0], 20, [10] * 4, True)
    samples, _, _ = batch_to_samples([group], LossConfig())
    trees = plan_trees(samples, max_tokens)
    assert sorted((t.prefix, len(t.members)) for t in trees) == expected
    assert all(t.tokens <= max_tokens or len(t.members) == 1 for t in trees)


def test_prefix_sharing_computes_fewer_positions_than_packing() -> None:
    """4 groups of 4 replies (10-15 tokens) to 40-token prompts: each prompt once, not 4x."""
    rng = np.random.default_rng(1)
    groups = [
        make_group(rng, [0.0, 1.0, 1.0, 0.0], 40, rng.integers(10, 16, 4).tolist(), True)
        for _ in range(4)
    ]
    samples, _, _ = batch_to_samples(groups, LossConfig())
    packed = micro_batch_plan(trainer_config("packed", budget=256), samples)
    shared = micro_batch_plan(trainer_config("prefix_shared", budget=256), samples)
    tokens = sum(len(s.tokens) for s in samples)
    assert packed.tokens == tokens and shared.tokens == tokens - 4 * 3 * 40
    assert sum(shared.costs) < 0.5 * sum(packed.costs)  # rows x width, padding included
    assert sum(shared.costs) < 1.1 * shared.tokens


# ---- the attention mask ---------------------------------------------------------------------


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_reply_sees_its_prompt_but_not_its_siblings_nor_other_trees(
    tiny_model: Path, attn: str
) -> None:
    model = load(tiny_model, attn).eval()
    samples = samples_of()
    trees = plan_trees(samples, max_tokens=64)
    long_prompt = next(t for t in trees if t.prefix == 20)
    partial = next(t for t in trees if t.prefix == 8)
    rows = [[long_prompt, partial]]  # two trees in one row
    reader = long_prompt.members[1]

    def reader_logp() -> torch.Tensor:
        mb = collate_trees(rows, samples)
        with torch.no_grad():
            logp, _ = model_logprobs(model, mb)  # (B, T-1)
        assert not logp.isnan().any()
        return logp[1, : len(samples[reader].tokens) - 1]

    before = reader_logp()
    rng = np.random.default_rng(7)
    for tree in rows[0]:  # its siblings' replies (before and after it), the other tree's too
        for i in tree.members:
            if i != reader:
                suffix = samples[i].tokens[tree.prefix :]
                suffix[:] = rng.integers(1, VOCAB, size=len(suffix))
    torch.testing.assert_close(reader_logp(), before, atol=1e-6, rtol=0)
    for i in long_prompt.members:  # the shared prompt: every member reads it
        samples[i].tokens[5] = samples[i].tokens[5] % (VOCAB - 1) + 1
    assert (reader_logp() - before).abs().max() > 1e-3


# ---- the same logprobs, loss and gradients as packed ----------------------------------------


def one_step(model: Any, cfg: TrainerConfig, samples: list[Sample]) -> dict[str, Any]:
    """Forward/backward of every micro-batch: per-sample logprobs, loss, metrics, gradients."""
    model.zero_grad(set_to_none=True)
    totals = batch_totals(samples)
    plan = micro_batch_plan(cfg, samples)
    logps: dict[int, torch.Tensor] = {}
    loss_sum, metric_sums = 0.0, dict[str, float]()
    for entry in plan.entries:
        mb = micro_batch(cfg, samples, entry)
        logp, entropy = model_logprobs(model, mb, cfg.loss.entropy_coef > 0)  # (B, T-1)
        for b, i in enumerate(members(entry)):
            logps[i] = logp[b, : len(samples[i].tokens) - 1].detach()
        x = LossInputs(
            logp, entropy, mb.mask, mb.advantages, mb.sft,
            mb.inference_logprobs, mb.has_inference, mb.ref_logprobs,
        )  # fmt: skip
        loss, metrics = grpo_loss(x, cfg.loss, totals, 100)
        loss.backward()
        loss_sum += loss.item()
        for key, value in metrics.items():
            metric_sums[key] = metric_sums.get(key, 0.0) + value.item()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {"plan": plan, "logp": logps, "loss": loss_sum, "metrics": metric_sums, "grads": grads}


@pytest.mark.parametrize("name", MIXED_LOSSES)
def test_prefix_shared_gives_the_loss_and_gradients_of_packed(tiny_model: Path, name: str) -> None:
    loss = MIXED_LOSSES[name]
    model = load(tiny_model)
    samples = samples_of(loss)
    assert {s.sft for s in samples} == {True, False} and len({s.temperature for s in samples}) >= 3
    packed = one_step(model, trainer_config("packed", loss), samples)
    shared = one_step(model, trainer_config("prefix_shared", loss), samples)
    assert len(shared["plan"].entries) > 1  # several micro-batches
    assert sum(shared["plan"].costs) < 0.8 * sum(packed["plan"].costs)
    assert packed["logp"].keys() == shared["logp"].keys() == set(range(len(samples)))
    for i, logp in packed["logp"].items():
        assert logp.abs().sum() > 0
        torch.testing.assert_close(shared["logp"][i], logp, atol=1e-5, rtol=0, msg=str(i))
    assert shared["loss"] == pytest.approx(packed["loss"], abs=1e-6, rel=1e-6)
    for key, value in packed["metrics"].items():
        assert shared["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for key, grad in packed["grads"].items():
        scale = grad.abs().max().item()
        assert scale > 0, key
        torch.testing.assert_close(shared["grads"][key], grad, atol=1e-5 * scale, rtol=1e-5)


def test_a_dummy_micro_batch_still_reaches_every_parameter(tiny_model: Path) -> None:
    """DDP's gradient all-reduce needs every parameter in the graph; the loop masks a dummy."""
    model = load(tiny_model)
    mb = micro_batch(trainer_config("prefix_shared"), samples_of(), None)
    assert mb.packed is not None and mb.packed.attention_mask is not None
    logp, _ = model_logprobs(model, mb)
    (logp * mb.mask * 0.0).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


# ---- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "fix"),
    [
        (["--loss.distill-coef", "0.1"], "--micro-batching bucketed"),
        (["--no-trained-logits-only"], "leave --trained-logits-only on"),
    ],
)
def test_prefix_shared_refuses_what_it_cannot_compute(flags: list[str], fix: str) -> None:
    argv = ["--model", "unused", "--micro-batching", "prefix_shared", *flags]
    with pytest.raises(ConfigError, match=fix):
        load_config(argv)


def test_a_group_longer_than_max_token_len_still_shares_one_prompt() -> None:
    """Each sequence fits max_token_len, their tree does not: the tree's row is bounded by the
    micro-batch budget, not by max_token_len (the demo's shape: 4 replies to a 40-token prompt
    with max_token_len 64)."""
    rng = np.random.default_rng(3)
    group = make_group(rng, [0.0, 1.0, 1.0, 0.0], 40, [12, 12, 12, 12], True)
    samples, _, _ = batch_to_samples([group], LossConfig())
    argv = ["--model", "unused", "--max-token-len", "64", "--micro-batch-tokens", "256",
            "--micro-batching", "prefix_shared"]  # fmt: skip
    plan = micro_batch_plan(load_config(argv, loss=LossConfig()), samples)
    (tree,) = [item for entry in plan.entries for row in entry for item in row]
    assert tree.prefix == 40 and len(tree.members) == 4
    assert plan.tokens == 40 + 4 * 12


# ---- groups whose prompts begin alike: one more level -----------------------------------------


def few_shot_batch(seed: int = 0) -> list[dict[str, Any]]:
    """Four groups whose prompts share 12 worked-example tokens before a 6-token question of
    their own (one question shares 2 more tokens with another's), and one unrelated group."""
    rng = np.random.default_rng(seed)
    examples = rng.integers(1, VOCAB, size=12)
    groups = [
        make_group(rng, [0.0, 1.0, 1.0], 18, rng.integers(2, 9, 3).tolist(), True) for _ in range(4)
    ]
    for group in groups:
        for t in group["tokens"]:
            t[:12] = examples
    for t in groups[1]["tokens"]:  # its question begins like group 0's
        t[12:14] = groups[0]["tokens"][0][12:14]
    groups.append(make_group(rng, [1.0, 0.0], 10, [5, 7], True))
    groups[-1]["tokens"][0][0] = groups[-1]["tokens"][1][0] = (examples[0] % (VOCAB - 1)) + 1
    return groups


def few_shot_samples(loss: LossConfig | None = None) -> list[Sample]:
    samples, _, _ = batch_to_samples(few_shot_batch(), loss or LossConfig())
    return samples


def test_groups_after_the_same_examples_nest_under_them_once() -> None:
    samples = few_shot_samples()
    plan = micro_batch_plan(trainer_config("prefix_shared", budget=512), samples)
    trees = [item for entry in plan.entries for row in entry for item in row]
    nested = [tree for tree in trees if tree.branches]
    assert len(nested) == 1 and len(trees) == 2  # the four few-shot groups; the unrelated one
    (parent,) = nested
    assert parent.prefix == 12  # the worked examples, once
    assert sorted(branch.prefix for branch in parent.branches) == [14, 18, 18]
    pair = next(branch for branch in parent.branches if branch.prefix == 14)
    assert [branch.prefix for branch in pair.branches] == [18, 18]  # groups 0 and 1
    assert all(
        len(b.members) == 3 and not b.branches for b in (*pair.branches, *parent.branches[1:])
    )
    assert parent.members == tuple(i for b in parent.branches for i in b.members)
    lengths = [len(s.tokens) for s in samples]
    replies = sum(lengths[i] - 18 for i in parent.members)
    assert parent.tokens == 12 + 2 + 2 * 4 + 2 * 6 + replies  # examples, pair, 4 questions
    assert plan.tokens == sum(t.tokens for t in trees)


def test_a_nested_tree_too_long_for_the_row_is_split_into_copies_that_fit() -> None:
    samples = few_shot_samples()
    whole = plan_trees(samples, 4096)
    parent = next(tree for tree in whole if tree.branches)
    cap = parent.tokens // 2 + 6
    trees = plan_trees(samples, cap)
    assert sorted(i for tree in trees for i in tree.members) == list(range(len(samples)))
    assert all(tree.tokens <= cap for tree in trees)
    copies = [tree for tree in trees if tree.prefix == 12]
    assert len(copies) >= 2  # the examples repeated in each copy
    assert sum(t.tokens for t in trees) > sum(t.tokens for t in whole)
    mb = collate_trees([[tree] for tree in trees], samples)  # every copy lays out
    assert mb.packed is not None and mb.packed.input_ids.shape[1] <= cap


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_reply_sees_the_examples_and_its_question_but_no_other_question(
    tiny_model: Path, attn: str
) -> None:
    model = load(tiny_model, attn).eval()
    samples = few_shot_samples()
    plan = micro_batch_plan(trainer_config("prefix_shared", budget=512), samples)
    (entry,) = plan.entries
    parent = next(item for row in entry for item in row if item.branches)
    mine, other = parent.branches[0], parent.branches[2]
    reader = mine.members[0]

    def reader_logp() -> torch.Tensor:
        mb = micro_batch(trainer_config("prefix_shared", budget=512), samples, entry)
        with torch.no_grad():
            logp, _ = model_logprobs(model, mb)
        assert not logp.isnan().any()
        return logp[list(members(entry)).index(reader), : len(samples[reader].tokens) - 1]

    before = reader_logp()
    for i in other.members:  # another group's question and replies
        samples[i].tokens[12:] = (samples[i].tokens[12:] % (VOCAB - 1)) + 1
    torch.testing.assert_close(reader_logp(), before, atol=1e-6, rtol=0)
    for i in mine.members:  # its own question
        samples[i].tokens[14] = samples[i].tokens[14] % (VOCAB - 1) + 1
    changed = reader_logp()
    assert (changed - before).abs().max() > 1e-3
    for i in parent.members:  # the worked examples every group reads
        samples[i].tokens[3] = samples[i].tokens[3] % (VOCAB - 1) + 1
    assert (reader_logp() - changed).abs().max() > 1e-3


@pytest.mark.parametrize("name", MIXED_LOSSES)
def test_nested_trees_give_the_loss_and_gradients_of_packed(tiny_model: Path, name: str) -> None:
    loss = MIXED_LOSSES[name]
    model = load(tiny_model)
    samples = few_shot_samples(loss)
    packed = one_step(model, trainer_config("packed", loss, budget=512), samples)
    shared = one_step(model, trainer_config("prefix_shared", loss, budget=512), samples)
    assert any(item.branches for entry in shared["plan"].entries for row in entry for item in row)
    assert sum(shared["plan"].costs) < 0.6 * sum(packed["plan"].costs)
    for i, logp in packed["logp"].items():
        torch.testing.assert_close(shared["logp"][i], logp, atol=1e-5, rtol=0, msg=str(i))
    assert shared["loss"] == pytest.approx(packed["loss"], abs=1e-6, rel=1e-6)
    for key, grad in packed["grads"].items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(shared["grads"][key], grad, atol=1e-5 * scale, rtol=1e-5)


# ---- the mask against its definition ----------------------------------------------------------


def member_offsets(row: list[Tree], samples: list[Sample]) -> dict[int, list[int]]:
    """Each member's token offsets in its row: its ancestors' segments, then its own suffix,
    the trees laid depth first one after the other."""
    offsets: dict[int, list[int]] = {}

    def walk(tree: Tree, at: int, start: int, above: list[int]) -> int:
        mine = [*above, *range(at, at + tree.prefix - start)]
        at += tree.prefix - start
        if tree.branches:
            for branch in tree.branches:
                at = walk(branch, at, tree.prefix, mine)
            return at
        for i in tree.members:
            suffix = len(samples[i].tokens) - tree.prefix
            offsets[i] = [*mine, *range(at, at + suffix)]
            at += suffix
        return at

    at = 0
    for tree in row:
        at = walk(tree, at, 0, [])
    return offsets


def rows_of_two(trees: list[Tree]) -> list[list[Tree]]:
    return [trees[k : k + 2] for k in range(0, len(trees), 2)]


@pytest.mark.parametrize(
    "case", ["trees_in_one_row", "nested", "nested_split", "split_in_shared_rows"]
)
def test_the_mask_lets_a_position_read_exactly_the_tokens_of_its_own_sequences(case: str) -> None:
    """Query q may read key k <= q iff some member's sequence holds both (padding: only
    itself), on rows with several trees, nested trees, split copies and padding."""
    if case == "trees_in_one_row":
        samples = samples_of()
        trees = plan_trees(samples, max_tokens=64)
        rows = [trees[:3], trees[3:]]
    else:
        samples = few_shot_samples()
        whole = plan_trees(samples, 4096)
        cap = next(t for t in whole if t.branches).tokens // 2 + 6
        trees = whole if case == "nested" else plan_trees(samples, cap)
        rows = rows_of_two(trees) if case == "split_in_shared_rows" else [[t] for t in trees]
    assert any(t.branches for t in trees) or case == "trees_in_one_row"
    mb = collate_trees(rows, samples)
    assert mb.packed is not None
    ids, positions = mb.packed.input_ids.numpy(), mb.packed.position_ids.numpy()
    allowed = mb.packed.attention_mask[:, 0].numpy()
    width = ids.shape[1]
    padded_rows = 0
    for r, row in enumerate(rows):
        expected = np.eye(width, dtype=bool)
        for i, offsets in member_offsets(row, samples).items():
            assert (ids[r, offsets] == samples[i].tokens).all()
            assert (positions[r, offsets] == np.arange(len(samples[i].tokens))).all()
            on = np.zeros(width, bool)
            on[offsets] = True
            expected |= np.tril(on[:, None] & on[None, :])
        padded_rows += int(sum(t.tokens for t in row) < width)
        assert (allowed[r] == expected).all(), f"row {r}"
    assert padded_rows > 0  # a row shorter than the widest: its padding reads only itself
