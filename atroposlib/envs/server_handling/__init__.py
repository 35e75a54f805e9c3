"""The inference engine clients an environment samples through, and ``ServerManager`` over them.

Backends (``openai_server``, ``vllm_server``, ``sglang_server``, ``trl_vllm_server``); their
base and settings (``server_baseline``, ``reasoning``, the lean ``http`` client); routing and
failover (``server_manager``, ``circuit``, ``adaptive_semaphore``, ``dedicated``); managed mode
with token ids and tool calls (``managed``, ``managed_server``, ``tool_call_translator``); the
local test server (``server_harness``) and server discovery (``slurm``). The OpenAI-compatible
agent proxy over them is :mod:`atroposlib.proxy`; ``managed_server_proxy`` and
``proxy_client`` here are Atropos's import paths for it.
"""
