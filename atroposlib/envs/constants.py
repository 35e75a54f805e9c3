"""Namespaces of the env CLI and YAML: ``--env.<field>``, ``--openai.<field>`` (Atropos 0.4)."""

ENV_NAMESPACE = "env"
OPENAI_NAMESPACE = "openai"
SERVER_MANAGER_NAMESPACE = "server"
NAMESPACE_SEP = "."
