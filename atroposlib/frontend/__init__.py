"""Atropos's ``atroposlib.frontend`` package: the HTML report of a JSONL dump (``jsonl2html``)."""
