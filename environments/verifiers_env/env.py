"""A verifiers environment on our loop: ``python environments/verifiers_env/env.py serve
--env.vf_env NAME --env.vf_args '{...}'`` (see README.md; the adapter is
``atroposlib.envs.adapters.verifiers_env``). This folder is on the import path, so the shipped
example taskset ``vf_arith`` loads by name."""

import sys
from pathlib import Path

from atroposlib.envs.adapters import verifiers_env

sys.path.append(str(Path(__file__).resolve().parent))


class VerifiersAdapterEnv(verifiers_env.VerifiersEnv):
    """The verifiers adapter as this folder's environment."""


if __name__ == "__main__":
    VerifiersAdapterEnv.cli()
