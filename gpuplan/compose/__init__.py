"""Composition: one kind's plan turned into another kind's problem, and the training bundle built from
them (Poseidon's parallel plan -> Tessel's schedule -> Lagom's NCCL settings, iterated to a fixed
point). See docs/plan.md."""

from gpuplan.compose.bundle import check_bundle, is_bundle, load_bundle, read_manifest, write_bundle
from gpuplan.compose.train import Composition, compose, plan_training, training_problem

__all__ = ["Composition", "compose", "plan_training", "training_problem", "check_bundle", "is_bundle", "load_bundle", "read_manifest", "write_bundle"]
