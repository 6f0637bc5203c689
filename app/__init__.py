"""The ReSpec Explorer web app (Gradio 6): compare ReSpec and EAGLE-2 side by side, scrub through
the step traces, tune every threshold, and replay recorded traces without a model.

Layout (ARCHITECTURE.md §6.8), from the page down:
* `ui.py` builds the page from `layout.py`'s tabs and wires events (CSS and script in `static/`);
* `handlers.py` holds the events (Run, replay, the step explorer), which return `views.py`'s dicts
  of component updates; `tuning.py` adds the run history and repeats; `lab.py` the Lab tab;
  `api.py` is the work of `/compare` and `/replay`;
* `runs.py` streams one method's run; `hub.py` holds the one shared model; `traces.py` reads and
  writes trace files;
* `render.py`, `figures.py`, `decoders.py`, `history.py` and `history_display.py` are pure functions
  from traces and runs to spans, tables, text and plotly figures (no Gradio import);
* `settings.py` maps controls, presets and the environment to an `EngineConfig` and the deployment
  caps; `state.py` is the per-session state; `text.py` holds the copy; `gpu.py` is the `spaces.GPU`
  shim; `record_traces.py` records the shipped traces.
Importing this package does no work.
"""
