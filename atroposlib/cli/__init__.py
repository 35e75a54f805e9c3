"""atroposlib.cli."""
