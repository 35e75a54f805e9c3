"""``atropos-sandbox-check``: which isolation mechanisms the code sandbox has on this host, what
enforces each limit, and hostile probes showing the limits hold. Exit 1 when isolation is weak
(code environments then refuse ``serve`` unless ``--env.sandbox.allow_weak_isolation``)."""

from __future__ import annotations

import json
import logging
import os
import sys

from pydantic import Field

from atroposlib.errors import SandboxError
from atroposlib.sandbox.isolation import isolation_report
from atroposlib.sandbox.proof import prove_limits
from atroposlib.utils.cli import parse_command_line
from atroposlib.utils.cli_settings import CommandLineSettings


class SandboxCheckSettings(CommandLineSettings):
    as_json: bool = Field(False, alias="json", description="Print the report as JSON.")
    no_probes: bool = Field(False, description="Skip the hostile probes.")


def main(argv: list[str] | None = None) -> None:
    args = parse_command_line(
        SandboxCheckSettings, argv, "atropos-sandbox-check", description=__doc__
    )
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        report = isolation_report()
        proofs = [] if args.no_probes else prove_limits()
    except SandboxError as error:
        sys.stderr.write(f"error: the sandbox cannot run here: {error}\n")
        raise SystemExit(2) from None
    if args.as_json:
        data = report.model_dump(mode="json")
        data["probes"] = [vars(proof) for proof in proofs]
        print(json.dumps(data, indent=2))
    else:
        print(f"code sandbox on this host (running as uid {os.geteuid()}): {report.isolation}")
        print("\nmechanisms")
        for name, detail in report.mechanisms.items():
            print(f"  {name:<20} {detail}")
        print("\nlimits")
        for name, how in report.limits.items():
            print(f"  {name:<20} {how}")
        if proofs:
            print("\nprobes (hostile programs run in the sandbox now)")
            for proof in proofs:
                verdict = "held" if proof.held else "NOT HELD"
                print(f"  {proof.limit:<22} {proof.attempt:<46} {proof.observed:<22} {verdict}")
        print("\nweaknesses" if report.weak else "\nno weaknesses found")
        for weakness in report.weaknesses:
            print(f"  - {weakness}")
    failed = [proof for proof in proofs if not proof.held]
    raise SystemExit(1 if report.weak or failed else 0)


if __name__ == "__main__":
    main()
