"""The wire contracts: one pydantic model for every body that crosses HTTP, one module per protocol.

- :mod:`atroposlib.wire.broker`: the broker's trajectory API (Atropos 0.4's, plus our additions).
- :mod:`atroposlib.wire.openai`: the inference server's OpenAI-compatible completions and chat.
- :mod:`atroposlib.wire.engine`: the engines' native API (``/generate``, ``/tokenize``, weight
  updates, LoRA, pause), as vLLM and SGLang speak it.
- :mod:`atroposlib.wire.common`: the request base, content types and sampling types they share.

The group itself (``ScoredData`` and its metadata) is defined in :mod:`atroposlib.group` and
the numeric bounds in :mod:`atroposlib.bounds`; :mod:`atroposlib.wire.broker` re-exports the
group's models.
"""
