"""Events: UI values -> settings -> runner stream -> throttled page updates (handlers, the API, the
Lab, tuning by hand, one method's streamed run)."""
