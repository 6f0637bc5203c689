"""What a model or head spec names: the shape of a Hugging Face Hub id.

Contract: `HUB_ID` matches "name" or "owner/name" (letters, digits, '_', '.', '-'); a spec that is
neither an existing path nor such an id is refused before anything is fetched
(respec/models/loading.py, respec/drafters/heads/checkpoint.py).
"""
from __future__ import annotations

import re

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")
