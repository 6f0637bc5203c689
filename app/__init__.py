"""The ReSpec Explorer web app (Gradio 6): compare ReSpec and EAGLE-2 side by side, scrub through
the step traces, tune every threshold, and replay recorded traces without a model.

Layout (ARCHITECTURE.md §6.8): `ui.py` builds the page and wires events; `handlers.py` turns UI
values into engine runs and throttled UI updates; `render.py` and `figures.py` are pure functions
from traces to spans, tables, text and plotly figures (no Gradio import); `settings.py` maps
controls and presets to an `EngineConfig`; `state.py` is the per-session state; `text.py` holds the
copy; `gpu.py` is the `spaces.GPU` shim. Importing this package does no work.
"""
