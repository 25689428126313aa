"""Integration tests: real frameworks (transformers.Trainer, Lightning), real models from
tests/matrix, and the zero-code runner. Helpers come from tests/recorder/rec_helpers.py."""

from __future__ import annotations


