"""The two systems of ``learning_vs_trl.py`` and what they share: task, reward, grader, eval.

``Task`` is the demo's environment (``environments/reasoning_gym/env.py`` with
``configs/local-cpu-env.yaml``): the same training pool, held-out problems, chat prompt and
reward function for both systems. Each run seed draws its own training stream, validation set
and test set (``StreamSeeds``: reasoning-gym seeds far apart, from a hash of the run seed and
the purpose), so seeds are independent draws rather than one stream shifted by a few items.
``served_greedy_answers`` is the one evaluator every model
folder (the base model, each system's snapshots) goes through, so both are graded identically:
atropos-local's own held-out evaluation (``env.py evaluate`` against the embedded server, the
fast decode path). ``greedy_replies`` (transformers' ``generate``) is the slow reference a test
compares it with.

``run_ours`` runs ``atropos-local`` (what ``scripts/demo`` runs) for a wall-clock budget and
keeps the pushed weights at a few moments; ``trl_worker`` (``python -m
benchmarks.learning_systems trl SPEC.json``) runs TRL's ``GRPOTrainer`` on the same task in
its own process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from atroposlib.envs.heldout import check_disjoint
from atroposlib.envs.reward_fns.graded import Graded, grade_answer
from benchmarks.serving import served_evaluation

REPO = Path(__file__).resolve().parents[1]
ENV_SCRIPT = REPO / "environments" / "reasoning_gym" / "env.py"
ENV_CONFIG = REPO / "configs" / "local-cpu-env.yaml"
# held-out problems served in one batch, at most (the server refuses rows over 1024)
ONE_BATCH_MAX = 256
TASKS = {
    "sums": ENV_CONFIG,
    "three_sums": REPO / "configs" / "local-cpu-three-sums-env.yaml",
    "family": REPO / "configs" / "local-cpu-family-env.yaml",
}
"""The benchmark's tasks by name: the demo's (two numbers 0-100), a harder sum, and one that is
not arithmetic (reasoning-gym family_relationships: who is who in a family of 3-4)."""
SWEEP_SEED = 0
"""The run seed the sweep tunes on (its training stream and validation set only)."""
GRID_SEEDS = (1, 2, 3)
"""The grid's run seeds (issue 46): each its own training stream and test set."""
SPLITS = ("validation", "test")
"""The held-out sets of a run seed: validation (the sweep chooses settings by it), test (the
grid's verdict; never looked at before the grid)."""


def load_env_module(path: Path = ENV_SCRIPT) -> ModuleType:
    """Import an environment script as a module (its folder is not a package)."""
    spec = importlib.util.spec_from_file_location("learning_task_env", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------
# The task both systems train on
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamSeeds:
    """The reasoning-gym seeds of one run seed: training stream, validation and test draws.

    Item ``i`` of a reasoning-gym dataset is built from ``Random(seed + i)``, so run seeds 0,
    1, 2 used as data seeds give one stream shifted by an item or two. Here each (run seed,
    purpose) hashes to its own 48-bit seed: two of them closer than the ~50,000 draws a task
    makes is a chance of about 1e-9 per pair.

    >>> StreamSeeds.of(0) == StreamSeeds.of(0) != StreamSeeds.of(1)
    True
    """

    train: int
    validation: int
    test: int

    @classmethod
    def of(cls, run_seed: int) -> StreamSeeds:
        return cls(*(stream_seed(run_seed, purpose) for purpose in ("train", "validation", "test")))


def stream_seed(run_seed: int, purpose: str) -> int:
    """A reasoning-gym seed for ``purpose`` of ``run_seed``: blake2b, stable everywhere."""
    digest = hashlib.blake2b(f"learning-grid\x00{run_seed}\x00{purpose}".encode(), digest_size=6)
    return int.from_bytes(digest.digest(), "big")


@dataclass
class Task:
    """Training stream, validation and test problems, prompt, reward and grader of one env
    config for one run seed (``StreamSeeds``): the three are pairwise disjoint, the held-out
    two drawn from the slice of the problem space training never reaches."""

    config: Any
    module: ModuleType
    train: list[dict]
    validation: list[dict]
    test: list[dict]
    scorer: Any
    disjointness: Any
    seeds: StreamSeeds
    env_config: Path = ENV_CONFIG

    @classmethod
    def load(cls, env_config: Path = ENV_CONFIG, seed: int = 0) -> Task:
        module = load_env_module()
        seeds = StreamSeeds.of(seed)
        settings = dict(yaml.safe_load(env_config.read_text())["env"])
        settings.update(seed=seed, train_seed=seeds.train, held_out_seed=seeds.test)
        config = module.ReasoningGymConfig(**settings)
        if len(config.tasks) != 1:
            raise ValueError(f"{env_config}: the benchmark runs one task, not {list(config.tasks)}")
        problems = module.build_problems(config)  # raises if held-out meets the training pool
        (name,) = config.tasks
        test = problems.test[name]
        shown = module.example_keys(config)
        excluded = shown | {module.entry_key(e) for e in test}
        validation = module.held_out_sets(config, seeds.validation, excluded)[name]
        pool = [*(module.entry_key(e) for e in problems.train[name]), *shown]
        check_disjoint([module.entry_key(e) for e in validation], pool, config.held_out_fraction)
        return cls(config, module, problems.train[name], validation, test,
                   problems.scorers[name], problems.disjointness, seeds, env_config)  # fmt: skip

    def problems(self, split: str) -> list[dict]:
        """The held-out problems of ``split`` (validation or test)."""
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: one of {SPLITS}")
        return self.validation if split == "validation" else self.test

    def env_flags(self, split: str = "test") -> list[str]:
        """``env.py`` flags giving this run seed's training stream and ``split``'s problems
        (atropos-local's env and the served evaluation)."""
        held_out = self.seeds.validation if split == "validation" else self.seeds.test
        flags = ["--env.seed", str(self.config.seed), "--env.train_seed", str(self.seeds.train),
                 "--env.held_out_seed", str(held_out)]  # fmt: skip
        if self.problems(split) is self.validation:
            flags += ["--env.held_out_exclude_seed", str(self.seeds.test)]
        return flags

    def shared_test_problems(self, seeds: Sequence[int]) -> dict[int, int]:
        """How many of this seed's test problems each other seed's test set also has: chance
        alone where the held-out slice is small (sums: ~515 problems, so two sets of 200
        share ~78; three sums: ~17,700, ~2)."""
        mine = {self.key(e) for e in self.test}
        return {
            other: len(mine & {self.key(e) for e in Task.load(self.env_config, other).test})
            for other in seeds
            if other != self.config.seed
        }

    @property
    def description(self) -> str:
        """E.g. ``basic_arithmetic (min_terms=2, max_terms=2, ...)``."""
        (name,) = self.config.tasks
        settings = self.config.task_configs.get(name, {})
        return f"reasoning-gym {name} ({', '.join(f'{k}={v}' for k, v in settings.items())})"

    @property
    def max_tokens(self) -> int:
        return int(self.config.max_completion_tokens)

    def prompt(self, entry: dict) -> list[dict]:
        return list(self.module.chat_prompt(self.config, entry["question"]))

    def reward(self, reply: str, entry: dict) -> float:
        """The training reward of the environment, exactly as its rollouts are scored."""
        config = self.config
        return float(
            self.module.score_reply(
                reply,
                entry,
                self.scorer,
                config.format_weight,
                config.lenient_answers,
                config.partial_format,
            )
        )

    def grade(self, reply: str, entry: dict) -> Graded:
        """Held-out grading: strict (exact format and right), lenient, format."""
        return grade_answer(reply, lambda answer: self.scorer.score_answer(answer, entry) >= 1.0)

    def key(self, entry: dict) -> str:
        return str(self.module.entry_key(entry))


# ---------------------------------------------------------------------------------------
# The one evaluator: greedy replies of a model folder to the held-out prompts
# ---------------------------------------------------------------------------------------


def greedy_replies(
    model_dir: Path,
    tokenizer_dir: Path,
    prompts: Sequence[list[dict]],
    max_tokens: int,
    batch_size: int = 50,
    threads: int = 1,
) -> list[str]:
    """Greedy (temperature 0) replies, batched with left padding, in fp32 on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    replies: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        texts = [
            tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            for p in chunk
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **batch,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, batch["input_ids"].shape[1] :]  # (B, new tokens)
        replies += tokenizer.batch_decode(new, skip_special_tokens=True)
    return replies


def with_tokenizer(model_dir: Path, tokenizer_dir: Path) -> Path:
    """``model_dir`` with the tokenizer files it lacks hard-linked from ``tokenizer_dir`` (TRL
    saves weights and config only; the server needs a tokenizer and chat template)."""
    for file in tokenizer_dir.iterdir():
        weights = "safetensors" in file.name or file.suffix in (".bin", ".pt")
        target = model_dir / file.name
        if file.is_file() and not weights and file.name != "config.json" and not target.exists():
            os.link(file, target)
    return model_dir


def served_greedy_answers(
    model_dir: Path,
    task: Task,
    out_dir: Path,
    threads: int = 2,
    eval_size: int | None = None,
    startup_s: float = 300.0,
    split: str = "test",
) -> list[dict[str, Any]]:
    """Greedy answers of ``model_dir`` to the task's ``split`` problems, as atropos-local
    evaluates: the embedded server (``python -m atroposlib.inference``, shared prompt beginnings
    on) serving the folder, ``env.py evaluate`` against it. -> the ``samples.jsonl`` rows
    (``problem``, ``response``, ``strict``, ``lenient``, ``formatted`` ...) in held-out order.
    Raises ``NotHealthyError`` naming the log if the server cannot serve the folder."""
    from atroposlib.localrun.settings import LocalRunSettings, take_env_config_budget

    run_settings = LocalRunSettings(env_config=task.env_config)
    take_env_config_budget(run_settings)
    problems = task.problems(split)
    size = len(problems) if eval_size is None else eval_size
    # Every problem in one batch: same replies, 1.2-1.35x faster on sums than the server's
    # default 64 rows, ~1.08x on three sums (benchmarks/README.md, held_out_eval.py).
    batch = str(min(size, ONE_BATCH_MAX))
    served_evaluation(
        model_dir, task.env_config, out_dir, eval_size=size, threads=threads,
        max_token_length=run_settings.max_token_len, server_flags=["--max-batch-size", batch],
        env_flags=["--openai.num_requests_for_eval", batch, *task.env_flags(split)],
        startup_s=startup_s,
    )  # fmt: skip
    with (out_dir / "samples.jsonl").open() as handle:
        rows = {row["problem"]: row for row in map(json.loads, handle)}
    wanted = [task.key(entry) for entry in problems[:size]]
    if sorted(rows) != sorted(wanted):
        raise RuntimeError(f"{out_dir}: env.py evaluate answered other problems than the task's")
    return [rows[key] for key in wanted]


@dataclass(frozen=True)
class Snapshot:
    """Weights of one system at one moment of its run."""

    system: str
    folder: Path
    elapsed_s: float
    step: int


# ---------------------------------------------------------------------------------------
# Machine load while a system runs
# ---------------------------------------------------------------------------------------


class LoadSampler:
    """The 1-minute load average every ``interval_s`` while in a ``with`` block."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.interval_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        values = self.samples or [os.getloadavg()[0]]
        return {"load_mean": sum(values) / len(values), "load_max": max(values)}


# ---------------------------------------------------------------------------------------
# Ours: atropos-local for a wall-clock budget, weights kept at a few moments
# ---------------------------------------------------------------------------------------


@dataclass
class OursRun:
    run_dir: Path
    snapshots: list[Snapshot] = field(default_factory=list)
    exit_code: int = 0
    wall_s: float = 0.0


def ours_command(
    run_dir: Path,
    minutes: float,
    seed: int,
    extra_args: Sequence[str] = (),
    env_config: Path = ENV_CONFIG,
    env_args: Sequence[str] | None = None,
    eval_every_steps: int = 0,
    eval_size: int = 0,
) -> list[str]:
    """The ``atropos-local`` command line of ``run_ours``."""
    env_args = ["--env.seed", str(seed)] if env_args is None else list(env_args)
    return [
        sys.executable,
        "-m",
        "atroposlib.cli.local",
        "--run-dir",
        str(run_dir),
        "--minutes",
        str(minutes),
        "--steps",
        "100000",
        "--eval-size",
        str(eval_size),
        "--eval-every-steps",
        str(eval_every_steps),
        "--seed",
        str(seed),
        # TRL's side trains in fp32 ("bf16": False below); atropos-local's default (auto) picks
        # bf16 on CPUs with native bf16, so both are pinned to fp32, like for like
        "--precision",
        "fp32",
        "--no-panel",
        "--keep-last-weights",
        "3",
        "--env-config",
        str(env_config),
        "--env-args",
        json.dumps(env_args),
        *extra_args,
    ]


def run_ours(
    run_dir: Path,
    minutes: float,
    seed: int,
    marks_s: Sequence[float],
    extra_args: Sequence[str] = (),
    env_config: Path = ENV_CONFIG,
    env_args: Sequence[str] | None = None,
    eval_every_steps: int = 0,
    eval_size: int = 0,
) -> OursRun:
    """``atropos-local --minutes --seed``; weights hard-linked at each mark. ``env_args`` go to
    the env (default: ``--env.seed seed``); ``eval_every_steps``: held-out evaluations of
    ``eval_size`` problems during the run (atropos-local's drop warning; 0: none)."""
    command = ours_command(run_dir, minutes, seed, extra_args, env_config, env_args,
                           eval_every_steps, eval_size)  # fmt: skip
    run = OursRun(run_dir)
    started = time.monotonic()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(run_dir.parent / f"{run_dir.name}.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        watcher = SnapshotWatcher(run_dir, list(marks_s))
        while process.poll() is None:
            watcher.poll(run.snapshots)
            time.sleep(1.0)
    watcher.poll(run.snapshots, final=True)
    run.exit_code, run.wall_s = process.returncode, time.monotonic() - started
    return run


class SnapshotWatcher:
    """Follows the trainer's metrics; at each mark keeps the weights of the first step done
    after it (hard links into ``snapshots/``, so the trainer's pruning cannot take them)."""

    def __init__(self, run_dir: Path, marks_s: list[float]) -> None:
        self.run_dir, self.marks = run_dir, sorted(marks_s)
        self.offset = 0
        self.elapsed: dict[int, float] = {}  # step -> trainer elapsed_s when it finished
        self.synced: list[int] = []

    def poll(self, out: list[Snapshot], final: bool = False) -> None:
        for row in self._new_rows():
            step = int(row.get("step") or 0)
            if "train/elapsed_s" in row:
                self.elapsed[step] = float(row["train/elapsed_s"])
            if "sync/seconds" in row and not row.get("sync/failed"):
                self.synced.append(step)
        while self.marks and self.synced:
            after = [s for s in self.synced if self.elapsed.get(s, -1.0) >= self.marks[0]]
            if not after:
                break
            self._keep(after[0], out)
            self.marks.pop(0)
        if final and self.synced and (not out or out[-1].step != self.synced[-1]):
            self._keep(self.synced[-1], out)

    def _keep(self, step: int, out: list[Snapshot]) -> None:
        source = self.run_dir / "checkpoints" / "weights" / f"step-{step}"
        target = self.run_dir / "snapshots" / f"step-{step}"
        if not target.exists():
            target.mkdir(parents=True)
            for file in source.iterdir():
                os.link(file, target / file.name)
        out.append(Snapshot("ours", target, self.elapsed[step], step))

    def _new_rows(self) -> list[dict[str, Any]]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        with path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------
# TRL: GRPOTrainer on the same task, in its own process
# ---------------------------------------------------------------------------------------


@dataclass
class TrlSpec:
    out_dir: str
    model: str
    minutes: float
    seed: int
    marks_s: list[float]
    threads: int
    env_config: str = str(ENV_CONFIG)
    overrides: dict[str, Any] = field(default_factory=dict)


def trl_settings(task: Task, spec: TrlSpec) -> dict[str, Any]:
    """GRPOConfig: TRL's documented defaults for every learning setting (lr 1e-6, 8
    generations, batch 8, temperature 1.0, epsilon 0.2, beta 0, one iteration), the Dr GRPO
    loss family as ours (loss_type dr_grpo, scale_rewards none), the task's reply budget as its
    max_completion_length, and the same hardware settings as ours (fp32, no gradient
    checkpointing: both are CPU speed choices, not learning ones)."""
    return {
        "output_dir": str(Path(spec.out_dir) / "trainer"),
        "seed": spec.seed,
        "loss_type": "dr_grpo",
        "scale_rewards": "none",
        "max_completion_length": task.max_tokens,
        "use_cpu": True,
        "bf16": False,
        "activation_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "max_steps": 10**6,  # the wall clock stops it; linear decay over 1e6 steps ~ constant
        "disable_tqdm": True,
        **spec.overrides,
    }


def trl_worker(spec: TrlSpec) -> None:
    started = time.monotonic()
    import torch

    torch.set_num_threads(spec.threads)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    task = Task.load(Path(spec.env_config), spec.seed)
    dataset = Dataset.from_list(
        [{"prompt": task.prompt(e), "problem": i} for i, e in enumerate(task.train)]
    )

    def task_reward(completions: list[Any], problem: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [task.reward(t, task.train[i]) for t, i in zip(texts, problem, strict=True)]

    out = Path(spec.out_dir)
    snapshots: list[dict[str, Any]] = []
    marks = sorted(spec.marks_s)
    deadline = spec.minutes * 60

    class WallClock(TrainerCallback):  # type: ignore[misc]
        """Keeps the weights at each mark and stops at the deadline; saving is off the clock."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            nonlocal deadline
            elapsed = time.monotonic() - started
            if (marks and elapsed >= marks[0]) or elapsed >= deadline:
                save_started = time.monotonic()
                folder = out / "snapshots" / f"step-{state.global_step}"
                kwargs["model"].save_pretrained(folder, safe_serialization=True)
                snapshots.append(
                    {"folder": str(folder), "elapsed_s": elapsed, "step": state.global_step}
                )
                while marks and elapsed >= marks[0]:
                    marks.pop(0)
                deadline += time.monotonic() - save_started
            if elapsed >= deadline:
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=spec.model,
        reward_funcs=task_reward,
        args=GRPOConfig(**trl_settings(task, spec)),
        train_dataset=dataset,
        callbacks=[WallClock()],
    )
    trainer.train()
    rows = [
        {"step": r["step"], "reward": r["reward"]}
        for r in trainer.state.log_history
        if "reward" in r and "step" in r
    ]
    result = {
        "steps": trainer.state.global_step,
        "samples": trainer.state.global_step * trainer.args.per_device_train_batch_size,
        "elapsed_s": time.monotonic() - started,
        "rewards": rows,
        "snapshots": snapshots,
        "settings": {k: v for k, v in trl_settings(task, spec).items() if k != "output_dir"},
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))


def run_trl(spec: TrlSpec) -> tuple[int, float]:
    """The TRL worker in a subprocess; -> (exit code, wall seconds)."""
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(asdict(spec), indent=2))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(spec.threads),
    }
    started = time.monotonic()
    with open(out.parent / f"{out.name}.log", "wb") as log:
        code = subprocess.call(
            [sys.executable, "-m", "benchmarks.learning_systems", "trl", str(out / "spec.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
    return code, time.monotonic() - started


def trl_snapshots(out_dir: Path, system: str = "trl") -> list[Snapshot]:
    result = json.loads((out_dir / "result.json").read_text())
    return [
        Snapshot(system, Path(s["folder"]), float(s["elapsed_s"]), int(s["step"]))
        for s in result["snapshots"]
    ]


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "trl":
        print("usage: python -m benchmarks.learning_systems trl SPEC.json", file=sys.stderr)
        return 2
    trl_worker(TrlSpec(**json.loads(Path(argv[1]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
