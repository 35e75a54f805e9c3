"""``atropos-local``: the whole RL loop on this machine, in one command.

Starts the broker, the embedded inference server, one environment and the GRPO trainer as
separate processes talking HTTP, shows a live panel, and stops everything on Ctrl-C or when the
trainer finishes. The run folder keeps logs/, checkpoints/, rollouts.jsonl, metrics.jsonl,
reward_curve.png and summary.json; with ``--eval-size N`` the same N held-out problems are
answered greedily before and after training (eval_before/, eval_after/).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import yaml
from pydantic import ValidationError
from pydantic_settings import CliApp, SettingsError
from rich.console import Console
from rich.live import Live

from atroposlib.launcher import Component, ComponentFailedError, Supervisor
from atroposlib.localrun import components, report
from atroposlib.localrun.components import RunLayout
from atroposlib.localrun.panel import StatusPoller, render
from atroposlib.localrun.settings import LocalRunSettings, resolve

console = Console(stderr=True)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = CliApp.run(LocalRunSettings, cli_args=sys.argv[1:] if argv is None else argv)
    except (SettingsError, ValidationError) as err:
        console.print(f"error: {str(err).splitlines()[0]}")
        return 2
    settings.env_script = resolve(settings.env_script)
    settings.env_config = resolve(settings.env_config)
    if not settings.env_script.exists() or not settings.env_config.exists():
        console.print(f"error: {settings.env_script} or {settings.env_config} does not exist")
        return 2
    layout = _layout(settings)
    console.print(f"run folder: {layout.run_dir}")
    signal.signal(signal.SIGTERM, _interrupt)
    with Supervisor(layout.run_dir) as supervisor, httpx.Client(timeout=2.0) as http:
        poller = StatusPoller(layout, http)
        try:
            code = _run(settings, layout, supervisor, poller)
        except ComponentFailedError as err:
            console.print(f"[red]error:[/red] {err}")
            code = 1
        except KeyboardInterrupt:
            console.print("interrupted: stopping every process")
            code = 130
        pids = supervisor.pids()
    _write_report(settings, layout, code, weight_version=poller.status.weight_version, pids=pids)
    return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops every process as Ctrl-C does


def _layout(settings: LocalRunSettings) -> RunLayout:
    run_dir = settings.run_dir or Path("runs") / datetime.now().strftime("local-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    if settings.model:
        model = settings.model
    else:
        from atroposlib.utils.test_model import ensure_test_model

        model = str(ensure_test_model())
    return RunLayout(run_dir.resolve(), model, components.free_port(), components.free_port())


def _run(
    settings: LocalRunSettings, layout: RunLayout, supervisor: Supervisor, poller: StatusPoller
) -> int:
    status = poller.status
    status.phase = "starting broker and inference server"
    supervisor.start(components.broker(layout))
    supervisor.start(components.inference(layout, settings))
    if settings.eval_size:
        status.phase = "held-out eval before training"
        _run_to_end(supervisor, components.evaluation(layout, settings, "before"))
    status.phase = "training"
    supervisor.start(components.trainer(layout, settings))
    supervisor.start(components.environment(layout, settings))
    with Live(render(status, settings.steps), console=console, refresh_per_second=2,
              transient=not settings.panel, redirect_stdout=False) as live:  # fmt: skip
        while (trainer_code := supervisor.returncode("trainer")) is None:
            _raise_if_env_failed(supervisor)
            live.update(render(poller.poll(), settings.steps))
            time.sleep(1.0)
        live.update(render(poller.poll(), settings.steps))
    if trainer_code != 0:
        raise ComponentFailedError(
            f"trainer exited with code {trainer_code}:\n{supervisor.log_tail('trainer')}"
        )
    if settings.eval_size:
        status.phase = "held-out eval after training"
        console.print(status.phase)
        _run_to_end(supervisor, components.evaluation(layout, settings, "after"))
    return 0


def _raise_if_env_failed(supervisor: Supervisor) -> None:
    for name, code in supervisor.exited():
        if name.startswith("env-") and code != 0:
            raise ComponentFailedError(
                f"{name} exited with code {code}:\n{supervisor.log_tail(name)}"
            )


def _run_to_end(supervisor: Supervisor, component: Component) -> None:
    supervisor.start(component)
    code = supervisor.wait(component.name)
    if code != 0:
        raise ComponentFailedError(
            f"{component.name} exited with code {code}:\n{supervisor.log_tail(component.name)}"
        )


def _write_report(
    settings: LocalRunSettings,
    layout: RunLayout,
    code: int,
    *,
    weight_version: int | None,
    pids: dict[str, int],
) -> None:
    env_config = yaml.safe_load(settings.env_config.read_text()) or {}
    format_weight = float((env_config.get("env") or {}).get("format_weight", 0.0))
    rows = report.rewards_by_step(layout.rollouts_file, format_weight)
    comparison = report.compare_evals(layout.run_dir / "eval_before", layout.run_dir / "eval_after")
    if rows:
        report.plot_rewards(rows, layout.run_dir / "reward_curve.png")
    summary = report.write_summary(
        layout.run_dir / "summary.json",
        rows,
        comparison,
        exit_code=code,
        steps=settings.steps,
        final_weight_version=weight_version,
        pids=pids,
    )
    headline = {k: v for k, v in summary.items() if k != "rewards_by_step"}
    console.print(json.dumps(headline, indent=1))
    console.print(f"run folder: {layout.run_dir}")


if __name__ == "__main__":
    raise SystemExit(main())
