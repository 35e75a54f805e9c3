"""atroposlib.localrun: the one-command local RL loop (atropos-local)."""
