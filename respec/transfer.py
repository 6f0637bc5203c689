"""Every host <-> device crossing of the engine, in one place, so a step's round trips can be counted.

Contract:
- `read(*tensors)` is ONE device-to-host read: every tensor is copied to the host (non-blocking on a
  GPU) and the host waits once; each comes back as `tolist()` (a list, or a number for a 0-d tensor).
- `to_host(tensor)` is one read that keeps a tensor (a row of probabilities under sampling).
- `upload(values, device, dtype)` is ONE host-to-device copy of a (nested) list of numbers;
  `to_device(tensor, device)` moves a host tensor (one upload); `upload_parts(parts, device)` is one copy of several int lists, split on the device.
- `barrier(devices)` waits for every queued kernel on each CUDA device given (counted as one read:
  the host waits for the device). Only the verify-cost curve uses it: anything else that only
  needs a time uses a `Stopwatch`.
- `Stopwatch(devices)` times device work without a barrier: CUDA events recorded on every device
  given (each device that holds weights of the timed work), read once they have completed (after
  the next `read`, which waits for them); on the CPU, perf_counter. `ms()` is None until done.
- `counting()` counts, for the duration of a `with` block, every read and upload made through this
  module into a `Transfers` record (the round trips of a step; tests/test_transfers.py). The same
  calls happen on the CPU, so the counts there equal the counts on a GPU.
Nothing runs at import time; the only module state is the stack of active counters.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch


@dataclass
class Transfers:
    """Host <-> device crossings made through this module while counting."""
    reads: int = 0          # device-to-host reads (each one host wait) and barriers
    uploads: int = 0        # host-to-device copies
    where: list[str] = field(default_factory=list)   # a label per crossing, in order ("read:verify", ...)

    @property
    def round_trips(self) -> int:
        return self.reads + self.uploads


_ACTIVE: list[Transfers] = []


def _count(kind: str, label: str) -> None:
    for rec in _ACTIVE:
        if kind == "read":
            rec.reads += 1
        else:
            rec.uploads += 1
        rec.where.append(f"{kind}:{label}")


@contextlib.contextmanager
def counting() -> Iterator[Transfers]:
    """Count the reads and uploads made through this module inside the block."""
    rec = Transfers()
    _ACTIVE.append(rec)
    try:
        yield rec
    finally:
        _ACTIVE.remove(rec)


def read(*tensors: torch.Tensor, label: str = "") -> list[Any]:
    """One device-to-host read of every tensor given: [t.tolist() for t in tensors]."""
    _count("read", label)
    on_gpu = [t for t in tensors if t.device.type == "cuda"]
    if not on_gpu:
        return [t.tolist() for t in tensors]
    host = [t.to("cpu", non_blocking=True) if t.device.type == "cuda" else t for t in tensors]
    for dev in {t.device for t in on_gpu}:
        torch.cuda.current_stream(dev).synchronize()
    return [t.tolist() for t in host]


def to_host(tensor: torch.Tensor, label: str = "") -> torch.Tensor:
    """One device-to-host read of `tensor`, kept a tensor (for a whole row of probabilities)."""
    _count("read", label)
    return tensor.to("cpu")


def to_device(tensor: torch.Tensor, device: torch.device, label: str = "") -> torch.Tensor:
    """`tensor` on `device`; counted as one upload when it starts on the host (wherever it goes, so
    the CPU counts what a GPU would), free when it is on a device already."""
    if tensor.device.type == "cpu":
        _count("upload", label)
    return tensor.to(device)


def upload(values: Sequence[Any], device: torch.device, dtype: torch.dtype = torch.long,
           label: str = "") -> torch.Tensor:
    """One host-to-device copy: torch.tensor(values) on `device`."""
    _count("upload", label)
    return torch.tensor(values, dtype=dtype, device=device)


def upload_parts(parts: Sequence[Sequence[int]], device: torch.device, label: str = "") -> list[torch.Tensor]:
    """One host-to-device copy of several int lists: the parts, as int64 tensors on `device`."""
    flat = [int(v) for part in parts for v in part]
    whole = upload(flat, device, torch.long, label)
    return list(torch.split(whole, [len(p) for p in parts]))


def barrier(devices: Sequence[torch.device], label: str = "") -> None:
    """Wait for every queued kernel on each CUDA device in `devices` (one counted wait, if any)."""
    cuda = [d for d in devices if d.type == "cuda"]
    if not cuda:
        return
    _count("read", label or "barrier")
    for dev in cuda:
        torch.cuda.synchronize(dev)


class Stopwatch:
    """Device time of the work queued between `start()` and `stop()` on `devices`, without waiting:
    CUDA events on each CUDA device (the slowest device's time), perf_counter when none is CUDA."""

    def __init__(self, devices: Sequence[torch.device] = ()) -> None:
        self.devices = tuple(d for d in devices if d.type == "cuda")
        self._t0 = self._t1 = 0.0
        self._events: list[tuple[Any, Any]] = []

    def start(self) -> "Stopwatch":
        if self.devices:
            self._events = []
            for dev in self.devices:
                with torch.cuda.device(dev):
                    ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    ev[0].record()
                self._events.append(ev)
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> None:
        self._t1 = time.perf_counter()
        for dev, (_, end) in zip(self.devices, self._events):
            with torch.cuda.device(dev):
                end.record()

    def ms(self) -> float | None:
        """Milliseconds between start and stop; None while an end event has not completed."""
        if not self.devices:
            return (self._t1 - self._t0) * 1000
        if not all(end.query() for _, end in self._events):
            return None
        return max(begin.elapsed_time(end) for begin, end in self._events)
