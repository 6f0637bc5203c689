"""ReSpec Explorer: `python app.py` serves the Gradio app on the embedded default model (Hugging Face
Spaces runs this same file). Building the page loads nothing; the model loads on the first run.
Environment: RESPEC_MODEL / RESPEC_MODELS, RESPEC_MAX_NEW_TOKENS, RESPEC_DEFAULT_NEW_TOKENS,
RESPEC_MAX_TREE_TOKENS, RESPEC_MAX_PROMPT_CHARS, RESPEC_MAX_PROMPT_TOKENS, RESPEC_TIME_LIMIT,
RESPEC_QUEUE_SIZE, RESPEC_MAX_SESSIONS (README "Deployment limits"), and Gradio's own GRADIO_SERVER_NAME / GRADIO_SERVER_PORT."""
from app.page.ui import build_demo, launch_kwargs

demo = build_demo()

if __name__ == "__main__":
    demo.launch(**launch_kwargs())
