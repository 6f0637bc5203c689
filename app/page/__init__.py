"""The page: layout of the tabs, event wiring (ui.build_demo) and the ZeroGPU shim. Imports events,
views and session; nothing imports it but app.py."""
