"""The speed environment variables, parsed in one place into one typed record.

Contract: `read_settings(environ=os.environ)` -> `AccelSettings`, every variable checked at once:
a bad value of any of them is one ConfigError (a ValueError) naming the variable and what it
takes, whichever part of the speed machinery asked first. Nothing is cached: a load reads the
environment it runs in (tests and A/B runs set variables between loads). The variables:

- `RESPEC_LINEAR_LAYOUT`: `auto` (default: measure which eager linears run faster as W @ x^T),
  `off`, `transposed` (every planned shape, unmeasured) — respec/accel/linear_layout.py;
- `RESPEC_ONE_ROW_AUTOTUNE`: `1` (default) or `0`: compiled small-row graphs autotuned over
  inductor's C++ GEMM template (respec/accel/compiled.py `one_row_options`);
- `RESPEC_PAD_ROWS`: unset (measured defaults), `0` (no static buckets) or `N[,M,...]` (forced
  buckets; counts below 3 dropped) — compiled.tree_buckets;
- `RESPEC_EAGER_FROM`: unset (measured), `off` (never eager) or a row count ≥ 2 from which compiled
  trees and head calls run eagerly — graph_choice.choose_eager_from.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from respec.errors import ConfigError

LAYOUT_CHOICES = ("auto", "off", "transposed")
_SWITCH = {"": True, "1": True, "on": True, "true": True, "0": False, "off": False, "false": False}


@dataclass(frozen=True)
class AccelSettings:
    linear_layout: str = "auto"                 # RESPEC_LINEAR_LAYOUT: one of LAYOUT_CHOICES
    one_row_autotune: bool = True               # RESPEC_ONE_ROW_AUTOTUNE
    pad_rows: tuple[int, ...] | None = None     # RESPEC_PAD_ROWS: None = measured defaults; () = none
    eager_from: int | None | str = ""           # RESPEC_EAGER_FROM: "" = measured, None = off, else rows


def _layout(value: str) -> str:
    choice = value.strip().lower() or "auto"
    if choice not in LAYOUT_CHOICES:
        raise ConfigError(f"RESPEC_LINEAR_LAYOUT must be one of {', '.join(LAYOUT_CHOICES)}, got {value!r}")
    return choice


def _autotune(value: str) -> bool:
    key = value.strip().lower()
    if key not in _SWITCH:
        raise ConfigError(f"RESPEC_ONE_ROW_AUTOTUNE must be 1 or 0, got {value!r}")
    return _SWITCH[key]


def _pad_rows(value: str) -> tuple[int, ...] | None:
    text = value.strip()
    if not text:
        return None
    try:
        rows = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise ConfigError(f"RESPEC_PAD_ROWS must be whole numbers separated by commas, got {value!r}") from None
    return tuple(sorted({r for r in rows if r >= 3}))


def _eager_from(value: str) -> int | None | str:
    text = value.strip().lower()
    if text in ("", "off"):
        return None if text == "off" else ""
    if not text.isdigit() or int(text) < 2:
        raise ConfigError(f"RESPEC_EAGER_FROM must be 'off' or a row count of 2 or more, got {value!r}")
    return int(text)


def read_settings(environ: Mapping[str, str] | None = None) -> AccelSettings:
    """The four speed variables of `environ` (default: the process environment) as one record;
    ConfigError in one line for the first bad value."""
    env = os.environ if environ is None else environ
    return AccelSettings(linear_layout=_layout(env.get("RESPEC_LINEAR_LAYOUT", "auto")),
                         one_row_autotune=_autotune(env.get("RESPEC_ONE_ROW_AUTOTUNE", "1")),
                         pad_rows=_pad_rows(env.get("RESPEC_PAD_ROWS", "")),
                         eager_from=_eager_from(env.get("RESPEC_EAGER_FROM", "")))
