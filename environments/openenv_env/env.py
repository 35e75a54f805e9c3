"""An OpenEnv environment on our loop: ``python environments/openenv_env/env.py serve
--env.openenv_url http://host:port`` or ``--env.openenv_command "... --port {port}"`` (see
README.md; the adapter is ``atroposlib.envs.adapters.openenv_env``)."""

from atroposlib.envs.adapters import openenv_env


class OpenEnvAdapterEnv(openenv_env.OpenEnvEnv):
    """The OpenEnv adapter as this folder's environment."""


if __name__ == "__main__":
    OpenEnvAdapterEnv.cli()
