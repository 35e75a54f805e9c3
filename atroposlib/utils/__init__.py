"""atroposlib.utils."""
