"""``atropos-sft-gen``: see :mod:`atroposlib.cli._export_main` and ``--help``."""

from __future__ import annotations

from collections.abc import Sequence

from atroposlib.cli._export_main import main as _export_main


def main(argv: Sequence[str] | None = None) -> None:
    _export_main("sft", argv)


if __name__ == "__main__":
    main()
