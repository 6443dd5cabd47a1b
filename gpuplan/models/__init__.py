"""The formal models: what is optimized. Data plus pure functions; no solvers, no torch."""
