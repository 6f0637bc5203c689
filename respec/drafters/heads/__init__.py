"""EAGLE draft heads: the EAGLE-1/2 module (eagle), the EAGLE-3 module (eagle3) and the checkpoint
loader and writer that dispatches between the two (checkpoint)."""
