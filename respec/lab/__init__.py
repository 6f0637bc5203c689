"""The lab: Spec-Bench runs (bench), their reports, the question sets, threshold sweeps and the
machine's roofline. Uses the engine through `respec.runner`; nothing in the engine imports it."""
