"""Measurements of the real machine with torch (imported lazily: torch loads only here)."""
