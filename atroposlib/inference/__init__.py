"""atroposlib.inference."""
