"""atroposlib.api."""
