"""A verifiers environment on our loop: ``python environments/verifiers_env/env.py serve
--env.vf_env NAME --env.vf_args '{...}'`` (see README.md; the adapter is
``atroposlib.envs.adapters.verifiers_env``)."""

from atroposlib.envs.adapters.verifiers_env import VerifiersEnv

if __name__ == "__main__":
    VerifiersEnv.cli()
