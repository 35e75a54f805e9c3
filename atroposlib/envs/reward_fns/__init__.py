"""atroposlib.envs.reward_fns."""
