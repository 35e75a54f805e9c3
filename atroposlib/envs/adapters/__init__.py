"""Adapters that run environments of other ecosystems on our loop.

``verifiers_env`` runs a verifiers (v1) environment, ``openenv_env`` plays episodes against an
OpenEnv server; both sample token-in/token-out through ``tokens`` and post ordinary groups.
"""
