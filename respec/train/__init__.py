"""Training EAGLE-2 draft heads for any target the engine loads (`python -m respec train-eagle`).

- `respec.train.prompts`: the project's own prompt sets (chat, code, math, translation, summarisation).
- `respec.train.data`: self-distilled responses (batched greedy generation, stored as token ids in
  resumable JSONL chunks) and offline teacher-forced text (docstrings / package READMEs).
- `respec.train.trainer`: the EAGLE recipe (SmoothL1 features + 0.1 soft CE through the frozen
  lm_head), resumable checkpoints, training log, published-format output.
- `respec.train.head`: the trainable head (construction, initialisation, batched training forward).
- `respec.train.features`: batches, target features and their cache, the draft vocabulary.
- `respec.train.exclusion` / `respec.train.store_check`: benchmark questions kept out of the data.
- `respec.train.pipeline`: the CLI's orchestration.
"""
from respec.train.trainer import TrainConfig, train_eagle

__all__ = ["TrainConfig", "train_eagle"]
