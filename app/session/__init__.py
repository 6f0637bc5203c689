"""Per-browser and per-process state: the session's runs, the run history, the shared model hub,
trace files on disk and the settings that turn UI values into an EngineConfig."""
