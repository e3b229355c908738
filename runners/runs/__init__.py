"""Runs on disk: one trained and tested (``training``) or many trained together (``ensemble``), their directories,
records and provenance, and what is read from or done to them once they are finished."""
