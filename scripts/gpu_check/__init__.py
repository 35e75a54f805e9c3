"""The GPU check: the trainer, the embedded server and weight pushes on one CUDA GPU, in one run.

Made for an air-gapped node (one H100/H200, Python 3.12, torch + transformers + peft installed,
no package registry, a copy of the working tree of at most 64 MiB) that may be lent for ten
minutes. ``scripts/gpu-check prepare`` (on a machine with PyPI) downloads, as wheels, what our
runtime needs beyond the node's packages and copies the tokenizer of the offline test model into
``.gpu-check/``; ``scripts/gpu-check run --out DIR`` (on the node) installs the wheels into a
private folder and runs the steps, most important first, each in its own process under a time
limit, never stopping at the first failure. Models are built from a config in code with random
weights (no weights travel). ``--device cpu`` runs every step on a tiny model (CI), so the check
cannot rot.

The steps and what each asserts: :mod:`gpu_check.steps`.
"""
