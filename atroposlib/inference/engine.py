"""The model side of generation: load weights, prefill new rows, decode a step, stop rows.

No threads and no HTTP here; :mod:`atroposlib.inference.scheduler` drives this from its
worker thread.
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from atroposlib.inference.batch import ActiveBatch, PaddedCache, Sequence, new_twin_id
from atroposlib.inference.fast_decode import context_kv, decode_step, empty_cache, supports
from atroposlib.inference.kv_cache import PrefixSharedCache, SharedPrefix
from atroposlib.inference.prompt_prefix import (
    MIN_SHARED_TOKENS,
    Context,
    beginning_to_continue,
    common_prefix_length,
    run_tails,
)
from atroposlib.inference.sampling import sample_next

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_COMPATIBILITY_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")
KEPT_PREFIXES = 8
"""Computed prompts (or their beginnings) kept for the next requests when no running row holds
them: a conversation's next turn continues its last prompt when that is among them."""


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """``auto`` means float32 on CPU and bfloat16 on a GPU."""
    if name == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return DTYPES[name]


def resolve_device(name: str) -> str:
    """``auto`` means ``cuda`` when torch sees a GPU, else ``cpu``."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def load_model(
    path: str | Path, device: str, dtype: torch.dtype, safetensors_only: bool = False
) -> PreTrainedModel:
    """Load a causal LM from a local transformers folder, in eval mode, on ``device``; never
    with the folder's own code, and (``safetensors_only``) never from pickled weights."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"model_path {str(path)!r} is not a folder on this machine")
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        dtype=dtype,
        trust_remote_code=False,
        use_safetensors=True if safetensors_only else None,
    )
    model.to(torch.device(device))  # type: ignore[arg-type]  # transformers stubs
    return model.eval()


def check_compatible(current: PreTrainedModel, candidate: PreTrainedModel) -> None:
    """Raise ``ValueError`` if ``candidate`` cannot replace ``current`` behind the tokenizer."""
    for key in _COMPATIBILITY_KEYS:
        ours, theirs = getattr(current.config, key, None), getattr(candidate.config, key, None)
        if ours != theirs:
            raise ValueError(
                f"the checkpoint's {key} is {theirs!r} but the served model's is {ours!r}; "
                "point model_path at a checkpoint of the served model"
            )


class ModelRunner:
    """A causal LM and its tokenizer, with batched prefill and single-step decode.

    ``fast_decode`` (default) decodes architectures :func:`fast_decode.supports` knows with
    the shared-prompt cache of :mod:`atroposlib.inference.kv_cache`; others, or
    ``fast_decode=False``, use the transformers forward and its cache, left-padded.
    ``share_prompt_prefixes`` (fast path only) runs the beginning that distinct prompts share
    once (:mod:`atroposlib.inference.prompt_prefix`); ``share_twin_rows`` (fast path only)
    computes one of the rows whose contexts are still the same (a group's samples before
    they diverge) and gives the others its logits, keys and values.
    """

    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        dtype: str = "auto",
        fast_decode: bool = True,
        share_prompt_prefixes: bool = True,
        share_twin_rows: bool = True,
    ) -> None:
        self.device = device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.want_fast_decode = fast_decode
        self.share_prompt_prefixes = share_prompt_prefixes
        self.share_twin_rows = share_twin_rows
        self.weights_generation = 0
        """Bumped whenever the served weights change: cached prompts of older ones are stale."""
        self._prefixes: weakref.WeakValueDictionary[tuple[int, ...], SharedPrefix] = (
            weakref.WeakValueDictionary()
        )  # contexts some running row shares, by their tokens
        self._latest_prefixes: list[SharedPrefix] = []  # kept alive between requests
        self.prompt_tokens = 0
        """Tokens of the distinct contexts prefilled since the start."""
        self.prompt_tokens_computed = 0
        """Of ``prompt_tokens``, those run through the model; the rest continued a computed
        beginning (a kept prompt, a running row's, or one shared with the same batch)."""
        self.model = load_model(model_path, device, self.dtype)
        self.vocab_size = int(self.model.config.vocab_size)
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 2048))
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_token_ids: frozenset[int] = frozenset(
            eos if isinstance(eos, list) else [] if eos is None else [eos]
        )
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else min(self.eos_token_ids, default=0))

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    @model.setter
    def model(self, model: PreTrainedModel) -> None:
        self._model = model
        self.fast_decode = self.want_fast_decode and supports(model)
        self.weights_generation += 1

    @torch.inference_mode()
    def prefill(self, rows: list[Sequence]) -> ActiveBatch:
        """Run the contexts of ``rows`` and sample each row's next token.

        A new row's context is its prompt; a preempted row resumes from its prompt plus the
        tokens it already has. A context shared by several rows (``n > 1``) is run once.
        """
        for row in rows:
            if row.params.seed is not None and row.generator is None:
                row.generator = torch.Generator(self.device).manual_seed(row.params.seed)
        contexts = [tuple(row.context_ids) for row in rows]
        self.prompt_tokens += sum(len(context) for context in set(contexts))
        if self.fast_decode:
            return self._prefill_shared(rows, contexts)
        unique = list(dict.fromkeys(contexts))
        cache, mask, logits = self._run_contexts(unique)
        if len(unique) < len(rows):  # the cache is copied per row
            where = {context: i for i, context in enumerate(unique)}
            source = torch.tensor([where[context] for context in contexts], device=mask.device)
            cache.batch_select_indices(source)
            mask, logits = mask[source], logits[source]
        first = torch.zeros(len(rows), dtype=torch.long, device=mask.device)
        batch = ActiveBatch(rows, PaddedCache(cache, mask), first, mask.sum(dim=1))
        self._sample_into(batch, logits)
        return batch

    def _prefill_shared(self, rows: list[Sequence], contexts: list[tuple[int, ...]]) -> ActiveBatch:
        """Prefill for the fast path: a context of several rows becomes a
        :class:`SharedPrefix` (or reuses a running one computed by the same weights); a
        context of one row is that row's private cache. With ``share_prompt_prefixes``, a
        context that begins like a prompt already computed (a GRPO env's next group after
        the same worked examples) or like the other new ones runs only its tail after that
        beginning, and its rows keep the tail privately (:meth:`_continued_prefixes`)."""
        counts: dict[tuple[int, ...], int] = {}
        for context in contexts:
            counts[context] = counts.get(context, 0) + 1
        shared: dict[tuple[int, ...], SharedPrefix] = {}
        for context in counts:
            running = self._prefixes.get(context)
            if running is not None and self._current(running) and running.last_logits is not None:
                shared[context] = running
        fresh = [context for context in counts if context not in shared]
        continued: dict[Context, SharedPrefix] = {}
        if self.share_prompt_prefixes:
            continued = self._continued_prefixes(fresh)
            fresh = [context for context in fresh if context not in continued]
        private: dict[tuple[int, ...], Tensor] = {}
        logits_of: dict[tuple[int, ...], Tensor] = {}
        if fresh:
            cache, _, logits = self._run_contexts(fresh)
            for i, context in enumerate(fresh):
                kv = context_kv(cache, i, len(context))
                prefix = SharedPrefix(
                    context, kv[0], kv[1], self.weights_generation, logits[i].clone()
                )
                if counts[context] > 1:
                    shared[context] = self._remember(prefix)
                else:
                    private[context], logits_of[context] = kv, logits[i]
                    if self.share_prompt_prefixes:  # a beginning for the next prompts
                        self._remember(prefix)
        for prefix, tails in _grouped(continued):
            self.prompt_tokens_computed += sum(len(tail) - len(prefix.tokens) for tail in tails)
            kvs, tail_logits = run_tails(self.model, prefix, tails, self.pad_token_id)
            for i, context in enumerate(tails):
                private[context], logits_of[context] = kvs[i], tail_logits[i]
            for i, context in list(enumerate(tails))[-KEPT_PREFIXES:]:
                # whole, for the next turn of its conversation (a few: each is a copy)
                self._remember(prefix.extended(context, kvs[i], tail_logits[i]))
        for context, prefix in shared.items():
            assert prefix.last_logits is not None
            logits_of[context] = prefix.last_logits
        twin_of = {context: new_twin_id() for context in counts}  # same context, same cache
        for row, context in zip(rows, contexts, strict=True):
            row.twin = twin_of[context]
        kv_cache = empty_cache(self.model, torch.device(self.device))
        prefixes = [shared.get(c) or continued.get(c) for c in contexts]
        kv_cache.add_rows(prefixes, [private.get(c) for c in contexts])
        positions = torch.tensor([len(c) for c in contexts], device=self.device)
        first = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        batch = ActiveBatch(rows, kv_cache, first, positions)
        self._sample_into(batch, torch.stack([logits_of[c] for c in contexts]))
        return batch

    def _current(self, prefix: SharedPrefix) -> bool:
        return prefix.generation == self.weights_generation

    def _remember(self, prefix: SharedPrefix) -> SharedPrefix:
        """Register ``prefix`` for later requests: while a row reads it, and among the few
        latest ones (so the next group finds its beginning even when none is running)."""
        self._prefixes[prefix.tokens] = prefix
        self._latest_prefixes = [
            kept for kept in self._latest_prefixes[-(KEPT_PREFIXES - 1) :] if self._current(kept)
        ] + [prefix]
        return prefix

    def _continued_prefixes(self, contexts: list[Context]) -> dict[Context, SharedPrefix]:
        """The computed beginning each of ``contexts`` continues: one of these weights (a
        running or latest prefix, or the beginning it shares with one of them, a view of its
        keys), else the beginning the rest have in common, run once now."""
        found: dict[Context, SharedPrefix] = {}
        for context in contexts:
            known = list(self._prefixes.values())
            prefix = beginning_to_continue(context, known, self.weights_generation)
            if prefix is not None:
                found[context] = prefix
                if prefix.tokens not in self._prefixes:
                    self._remember(prefix)
        rest = [context for context in contexts if context not in found]
        length = common_prefix_length(rest) if len(rest) > 1 else 0
        if length >= MIN_SHARED_TOKENS:
            tokens = rest[0][:length]
            cache, _, logits = self._run_contexts([tokens])
            kv = context_kv(cache, 0, length)
            prefix = SharedPrefix(tokens, kv[0], kv[1], self.weights_generation, logits[0].clone())
            found.update(dict.fromkeys(rest, self._remember(prefix)))
        return found

    def _run_contexts(self, contexts: list[tuple[int, ...]]) -> tuple[DynamicCache, Tensor, Tensor]:
        """The transformers forward over ``contexts`` (left-padded): its cache, the mask
        (U, L) and each context's next-token logits (U, V)."""
        width = max(len(context) for context in contexts)
        self.prompt_tokens_computed += sum(len(context) for context in contexts)
        ids = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, context in enumerate(contexts):
            ids[i, width - len(context) :] = torch.tensor(context)
            mask[i, width - len(context) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return cache, mask, out.logits[:, -1, :]

    @torch.inference_mode()
    def prompt_logprobs(
        self, ids: list[int], top_k: int
    ) -> tuple[list[float | None], list[list[tuple[float, int]] | None]]:
        """Teacher scoring: each token's logprob given the ones before it (None for the
        first), and the ``top_k`` most likely tokens at each position."""
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=tokens).logits[0, :-1].float()  # (L-1, V)
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(-1, tokens[0, 1:, None]).squeeze(-1).tolist()
        tops: list[list[tuple[float, int]] | None] = [None]
        if top_k > 0:
            values, indices = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
            pairs = zip(values.tolist(), indices.tolist(), strict=True)
            tops += [list(zip(v, i, strict=True)) for v, i in pairs]
        else:
            tops += [None] * (len(ids) - 1)
        return [None, *chosen], tops

    @torch.inference_mode()
    def decode(self, batch: ActiveBatch) -> int:
        """Feed every row's last token through the model and sample the next one; the rows
        computed (twin rows count once)."""
        cache = batch.cache
        computed = len(batch)
        if isinstance(cache, PrefixSharedCache):
            twins = batch.twins() if self.share_twin_rows else None
            logits = decode_step(self.model, cache, batch.next_tokens, batch.positions, twins)
            if twins is not None:
                logits, computed = logits[twins[1]], len(twins[0])
        else:
            cache.grow()
            out = self.model(
                input_ids=batch.next_tokens.unsqueeze(1),
                attention_mask=cache.attention_mask,
                position_ids=batch.positions.unsqueeze(1),
                past_key_values=cache.cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
        batch.positions = batch.positions + 1
        self._sample_into(batch, logits)
        return computed

    def parameters(self) -> dict[str, torch.nn.Parameter]:
        """Every parameter by name; tied weights appear under each of their names."""
        return dict(self.model.named_parameters(remove_duplicate=False))

    def install(self, tensors: dict[str, Tensor]) -> None:
        """Serve ``tensors`` (staged by :mod:`atroposlib.inference.weight_transfer`) in place
        of the parameters of the same names; nothing changes if one does not fit."""
        params = self.parameters()
        for name, tensor in tensors.items():
            param = params.get(name)
            if param is None:
                raise KeyError(f"the served model has no parameter {name!r}")
            if tensor.shape != param.shape or tensor.dtype != param.dtype:
                raise ValueError(
                    f"{name}: staged {tuple(tensor.shape)} {tensor.dtype} does not "
                    f"fit the served {tuple(param.shape)} {param.dtype}"
                )
        for name, tensor in tensors.items():
            params[name].data = tensor.to(params[name].device)
        if tensors:
            self.weights_generation += 1

    def abort(self, row: Sequence) -> None:
        """End ``row`` now with what it has (a pause in ``abort`` mode)."""
        row.finish_reason = "abort"
        row.text = str(self.tokenizer.decode(row.output_ids, skip_special_tokens=True))

    def _sample_into(self, batch: ActiveBatch, logits: torch.Tensor) -> None:
        params = [row.params for row in batch.rows]
        sampled = sample_next(logits, params, [row.generator for row in batch.rows])
        batch.next_tokens = torch.tensor(sampled.token_ids, dtype=torch.long, device=logits.device)
        successors: dict[tuple[int, int], int] = {}  # twins that sample the same token stay so
        for i, row in enumerate(batch.rows):
            row.output_ids.append(sampled.token_ids[i])
            row.twin = successors.setdefault((row.twin, sampled.token_ids[i]), new_twin_id())
            row.logprobs.append(sampled.logprobs[i])
            if row.params.top_logprobs:
                row.top_logprobs.append(sampled.top_logprobs[i])
            self._check_stop(row)

    def _check_stop(self, row: Sequence) -> None:
        token = row.output_ids[-1]
        stop_ids = set(row.params.stop_token_ids)
        if not row.params.ignore_eos:
            stop_ids |= self.eos_token_ids
        if token in stop_ids:
            row.finish_reason, row.matched_stop = "stop", token
        elif row.params.stop:
            text = str(self.tokenizer.decode(row.output_ids, skip_special_tokens=True))
            hits = [(text.find(s), s) for s in row.params.stop if s in text]
            if hits:
                cut, matched = min(hits)
                row.finish_reason, row.matched_stop, row.text = "stop", matched, text[:cut]
                return
        if row.finish_reason is None and len(row.output_ids) >= row.params.max_new_tokens:
            row.finish_reason = "length"
        if row.finished:
            row.text = str(self.tokenizer.decode(row.output_ids, skip_special_tokens=True))


def _grouped(continued: dict[Context, SharedPrefix]) -> list[tuple[SharedPrefix, list[Context]]]:
    """Each shared prefix with the contexts that continue it, in order."""
    groups: dict[int, tuple[SharedPrefix, list[Context]]] = {}
    for context, prefix in continued.items():
        groups.setdefault(id(prefix), (prefix, []))[1].append(context)
    return list(groups.values())
