"""The GRPO trainer for atroposlib: the loop is train.py, read top to bottom (see README.md)."""
