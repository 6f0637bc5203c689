"""A stand-in for the `spaces` package of a ZeroGPU Space, for tests: `GPU(fn)` (or
`GPU(duration=...)(fn)`) runs `fn` in a forked worker process, pickling its arguments and every
value it yields or returns, as `spaces` does, so an unpicklable yield fails here as it fails there
and nothing the worker changes in memory reaches the caller except through what it yields.
Generators run in lock-step: the worker waits until its yield has been taken before it goes on,
so a test can act (press Stop) between two yields."""
from __future__ import annotations

import functools
import inspect
import multiprocessing
import pickle


def _worker(conn, fn, payload: bytes) -> None:
    import torch
    torch.set_num_threads(1)                     # a forked child must not reuse the parent's thread pool
    try:
        args, kwargs = pickle.loads(payload)
        if inspect.isgeneratorfunction(fn):
            for value in fn(*args, **kwargs):
                conn.send(("yield", pickle.dumps(value)))
                if conn.recv() != "next":
                    return
            conn.send(("done", None))
        else:
            conn.send(("return", pickle.dumps(fn(*args, **kwargs))))
    except (EOFError, BrokenPipeError):
        return
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        try:
            blob = pickle.dumps(exc)
        except Exception:  # noqa: BLE001
            blob = pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
        conn.send(("error", blob))
    finally:
        conn.close()


def _start(fn, args, kwargs):
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    payload = pickle.dumps((args, kwargs))       # the arguments cross the boundary too
    proc = ctx.Process(target=_worker, args=(child, fn, payload), daemon=True)
    proc.start()
    child.close()
    return proc, parent


def _stop(proc, conn) -> None:
    conn.close()
    proc.join(timeout=30)
    if proc.is_alive():
        proc.terminate()


def GPU(fn=None, **_settings):  # noqa: N802 - the name `spaces` uses
    if fn is None:
        return lambda f: GPU(f, **_settings)
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            proc, conn = _start(fn, args, kwargs)
            try:
                while True:
                    kind, blob = conn.recv()
                    if kind == "done":
                        return
                    if kind == "error":
                        raise pickle.loads(blob)
                    yield pickle.loads(blob)
                    conn.send("next")
            finally:
                _stop(proc, conn)
        return gen

    @functools.wraps(fn)
    def call(*args, **kwargs):
        proc, conn = _start(fn, args, kwargs)
        try:
            kind, blob = conn.recv()
            if kind == "error":
                raise pickle.loads(blob)
            return pickle.loads(blob)
        finally:
            _stop(proc, conn)
    return call
