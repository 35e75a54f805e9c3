"""``POST /generate``: SGLang's token-in, token-out endpoint; ``POST /tokenize``: the served
tokenizer's ids for a text (vLLM's and SGLang's shape; envs check their tokenizer with it).

One prompt with ``n == 1`` answers a single object; a list of prompts or ``n > 1`` answers
a list, prompt-major (all choices of prompt 0, then prompt 1, ...). ``sampling_params.stop``
takes strings, token ids or both.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from atroposlib.inference.batch import Sequence
from atroposlib.inference.engine import ModelRunner
from atroposlib.inference.limits import check_request_size
from atroposlib.inference.requests import (
    bad_request,
    budget,
    prompt_batch,
    sequences,
    stop_conditions,
)
from atroposlib.inference.sampling import SamplingParams
from atroposlib.inference.serving import run_job
from atroposlib.inference.state import server_state
from atroposlib.wire.engine import (
    GenerateFinishReason,
    GenerateMetaInfo,
    GenerateRequest,
    GenerateResponse,
    TokenizeRequest,
    TokenizeResponse,
    WeightVersionSpan,
)

router = APIRouter()


@router.post("/generate", response_model=GenerateResponse | list[GenerateResponse])
async def generate(
    body: GenerateRequest, request: Request
) -> GenerateResponse | list[GenerateResponse] | Response:
    state = server_state(request)
    if (body.input_ids is None) == (body.text is None):
        raise bad_request("input_ids", "give exactly one of input_ids and text", 422)
    prompt = body.input_ids if body.input_ids is not None else body.text
    assert prompt is not None
    single = isinstance(prompt, str) or (bool(prompt) and isinstance(prompt[0], int))
    prompts = prompt_batch(state.runner, prompt, "input_ids")
    sp = body.sampling_params
    field = "sampling_params.max_new_tokens"
    limits = [budget(state.runner, len(ids), sp.max_new_tokens, field) for ids in prompts]
    check_request_size(state.settings, "input_ids", limits, sp.n, field)
    stop, stop_ids = stop_conditions(state.runner, sp.stop, sp.stop_token_ids, "sampling_params.")
    seed = sp.seed if sp.seed is not None else sp.sampling_seed
    params = SamplingParams(
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=max(sp.top_k, 0),
        min_p=sp.min_p,
        stop=stop,
        stop_token_ids=stop_ids,
        ignore_eos=sp.ignore_eos,
        seed=seed,
        top_logprobs=body.top_logprobs_num if body.return_logprob else 0,
    )
    done = await run_job(request, state.scheduler, sequences(prompts, sp.n, params, limits))
    if isinstance(done, Response):
        return done
    state.sample_log.record(done)
    answers = [_answer(seq, body.return_logprob) for seq in done]
    if body.return_logprob and body.logprob_start_len >= 0:
        await _add_prompt_logprobs(state.runner, answers, prompts, sp.n, body)
    return answers[0] if single and sp.n == 1 else answers


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    """``model`` is not checked (as SGLang): every served name shares the base's tokenizer,
    and envs name the model as they do for ``/generate``, which takes no name."""
    state = server_state(request)
    encode = state.runner.tokenizer.encode
    ids = await asyncio.to_thread(encode, body.prompt, add_special_tokens=body.add_special_tokens)
    return TokenizeResponse(
        tokens=list(ids), count=len(ids), max_model_len=state.runner.context_length
    )


async def _add_prompt_logprobs(
    runner: ModelRunner,
    answers: list[GenerateResponse],
    prompts: list[list[int]],
    n: int,
    body: GenerateRequest,
) -> None:
    """SGLang's ``input_token_logprobs``/``input_top_logprobs`` (teacher scoring for
    distillation), computed once per prompt from ``logprob_start_len`` on."""
    start = body.logprob_start_len
    for index, ids in enumerate(prompts):
        chosen, tops = await asyncio.to_thread(runner.prompt_logprobs, ids, body.top_logprobs_num)
        token_logprobs = [(lp, t, None) for lp, t in zip(chosen, ids, strict=True)][start:]
        top = [None if p is None else [(lp, t, None) for lp, t in p] for p in tops][start:]
        for answer in answers[index * n : (index + 1) * n]:
            answer.meta_info.input_token_logprobs = token_logprobs
            if body.top_logprobs_num:
                answer.meta_info.input_top_logprobs = top


def _answer(seq: Sequence, return_logprob: bool) -> GenerateResponse:
    if seq.finish_reason == "length":
        reason = GenerateFinishReason(type="length", length=len(seq.output_ids))
    elif seq.finish_reason == "abort":
        reason = GenerateFinishReason(type="abort", message="aborted by a weight update pause")
    else:
        reason = GenerateFinishReason(type="stop", matched=seq.matched_stop)
    spans = [WeightVersionSpan(version=str(v), start=s, end=e) for v, s, e in seq.version_spans()]
    meta = GenerateMetaInfo(
        finish_reason=reason,
        prompt_tokens=len(seq.prompt_ids),
        completion_tokens=len(seq.output_ids),
        weight_version=seq.weight_version,
        weight_versions=spans,
    )
    if return_logprob:
        meta.output_token_logprobs = [
            (lp, t, None) for lp, t in zip(seq.logprobs, seq.output_ids, strict=True)
        ]
        if seq.params.top_logprobs:
            meta.output_top_logprobs = [
                [(lp, t, None) for t, lp in step] for step in seq.top_logprobs
            ]
    return GenerateResponse(text=seq.text, output_ids=seq.output_ids, meta_info=meta)
