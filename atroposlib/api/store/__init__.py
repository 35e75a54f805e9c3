"""atroposlib.api.store."""
