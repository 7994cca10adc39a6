"""Helpers for tests and device runs: synthetic GGUF files (see synth.py)."""
