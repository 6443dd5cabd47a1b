"""Solvers: how each model is optimized. Each module registers its solvers by name."""
