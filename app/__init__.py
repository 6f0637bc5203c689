"""The ReSpec Explorer web app (Gradio 6): compare ReSpec and EAGLE-2 side by side, scrub through
the step traces, tune every threshold, and replay recorded traces without a model.

Rooms by layer (ARCHITECTURE.md §6), imports pointing one way, page -> events -> views / session ->
respec's public API (`respec/__init__.py`, `respec.runner`, `respec.models`, `respec.lab`):
* `page/`: `ui.py` builds the page from `layout.py`'s tabs and wires events (CSS and script in
  `static/`); `gpu.py` is the `spaces.GPU` shim;
* `events/`: `handlers.py` (Run, replay, the step explorer), returning `updates.py`'s dicts of
  component updates; `tuning.py` adds the run history and repeats; `lab.py` the Lab tab; `api.py`
  is the work of `/compare` and `/replay`; `runs.py` streams one method's run; `record_traces.py`
  records the shipped traces;
* `views/`: pure functions from traces and runs to spans, tables, text and plotly figures
  (`render.py`, `figures.py`, `anatomy_view.py`, `history_view.py`, `decoders.py`, `plot_style.py`;
  `text.py` holds the copy); no Gradio import;
* `session/`: `state.py` the per-session state, `history.py` the run history, `hub.py` the one
  shared model, `traces.py` trace files on disk, `settings.py` controls, presets and the
  environment -> an `EngineConfig` and the deployment caps.
Importing this package does no work.
"""
