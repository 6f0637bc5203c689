"""Per-session state, kept in `gr.State` (never in module globals): the runs on screen, where they
came from, and the tokenizer-free text needed to replay them.

Contract: a `SessionState` holds up to three finished runs keyed by column ("respec", "eagle",
"vanilla"), each a `GenerationResult` plus a decoder that can turn its token ids into text
(`TokenizerDecoder` or `TableDecoder`, app/views/decoders.py). Live
runs and uploaded trace files end up here the same way, so every view renders from this object
alone and replay needs no model.

Stop crosses processes: on a ZeroGPU Space a run decodes in `spaces`' GPU worker on a pickled copy
of the state, while Stop runs in the main process. `stop_requested` is therefore a flag file named by
the session's random `token` (in the temp folder both processes share) as well as a field: setting
it writes or removes the file, reading it checks both. The Lab has a Stop flag of its own
(`lab_stop_requested`, named by `lab_token`), renewed by `begin_lab`, so stopping a Lab run never
stops the tab's Compare run or the reverse. Nothing is written at import.
"""
from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.session.history import History
from app.session.settings import COLUMN_METHODS, method_label

if TYPE_CHECKING:
    from app.views.decoders import TableDecoder, TokenizerDecoder
    from respec.trace import GenerationResult

#: Columns of the compare view, in display order.
RUN_KEYS: tuple[str, ...] = tuple(COLUMN_METHODS)


def run_key_for(method: str) -> str:
    """Which column a method's run belongs in."""
    if method == "eagle2":
        return "eagle"
    if method == "vanilla":
        return "vanilla"
    return "respec"          # respec and its variants, and SAM-Decoding (retrieval + EAGLE-2)


@dataclass
class Run:
    result: GenerationResult
    decoder: TokenizerDecoder | TableDecoder
    origin: str = "live"             # "live", or the trace file name it was read from

    @property
    def method(self) -> str:
        return self.result.config.method

    @property
    def label(self) -> str:
        return method_label(self.method)


@dataclass
class SessionState:
    runs: dict[str, Run] = field(default_factory=dict)
    selected: str = "respec"         # the run the step explorer shows
    step: int = 0                    # the step the explorer shows
    trace_dir: str | None = None     # this session's folder for downloadable trace files
    last_render_ms: list[float] = field(default_factory=list)   # server time of each streamed update
    running: bool = False            # a run of this tab is queued or going (set by Run, cleared at its end / Stop)
    history: History = field(default_factory=History)   # this tab's Compare runs (app/session/history.py); clear() keeps it
    token: str = field(default_factory=lambda: uuid.uuid4().hex)   # names this tab's Stop flag file
    stopped: bool = False            # Stop was pressed in this process (see stop_requested)
    lab_token: str = field(default_factory=lambda: uuid.uuid4().hex)   # names this tab's Lab Stop flag file

    @property
    def stop_requested(self) -> bool:
        """Stop was pressed during the current run (cleared by the next Run), in this process or
        in another holding a copy of this state (its flag file)."""
        return self.stopped or _stop_flag(self.token).exists()

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        self.stopped = bool(value)
        _set_flag(_stop_flag(self.token), value)

    @property
    def lab_stop_requested(self) -> bool:
        """The Lab's Stop was pressed during the current Lab run (its flag file: any process)."""
        return _stop_flag("lab-" + self.lab_token).exists()

    @lab_stop_requested.setter
    def lab_stop_requested(self, value: bool) -> None:
        _set_flag(_stop_flag("lab-" + self.lab_token), value)

    def begin_lab(self) -> None:
        """Run Lab was pressed: a fresh, clear Lab Stop flag."""
        self.lab_stop_requested = False
        self.lab_token = uuid.uuid4().hex

    def begin_run(self) -> None:
        """Run was pressed: running, with a fresh Stop flag of its own (copies of a page's default
        state share a token until their first run)."""
        self.stop_requested = False
        self.token = uuid.uuid4().hex
        self.running = True

    def put(self, key: str, run: Run) -> None:
        self.runs[key] = run
        if self.selected not in self.runs:
            self.selected = key

    def clear(self) -> None:
        self.runs.clear()
        self.step = 0

    def current(self) -> Run | None:
        if self.selected in self.runs:
            return self.runs[self.selected]
        for key in RUN_KEYS:
            if key in self.runs:
                self.selected = key
                return self.runs[key]
        return None

    def choices(self) -> list[tuple[str, str]]:
        """(label, key) pairs for the explorer's run picker."""
        return [(self.runs[k].label, k) for k in RUN_KEYS if k in self.runs]


def _stop_flag(token: str) -> Path:
    """The Stop flag file of the session `token` (shared by the main process and the GPU worker)."""
    return Path(tempfile.gettempdir()) / "respec-stop" / token


def _set_flag(flag: Path, value: bool) -> None:
    """Write (True) or remove (False) a Stop flag file."""
    if value:
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.touch()
    else:
        flag.unlink(missing_ok=True)
