"""The ``view-run`` browser: scored groups with per-token colouring (Gradio app)."""
