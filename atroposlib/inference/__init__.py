"""The embedded inference server: OpenAI-compatible, token-level, reloadable, on CPU or a GPU.

    python -m atroposlib.inference --model FOLDER --port 9001

See :mod:`atroposlib.inference.app` for the endpoints and
:mod:`atroposlib.inference.sampling` for what the reported logprobs mean.
"""

from atroposlib.inference.settings import InferenceSettings

__all__ = ["InferenceSettings", "create_app"]


def __getattr__(name: str) -> object:
    if name == "create_app":  # importing the app pulls in torch; do it on first use
        from atroposlib.inference.app import create_app

        return create_app
    raise AttributeError(name)
