"""Exports of a training bundle to other trainers: one module per trainer, the only place that knows its
format (torchtitan.py, megatron.py); common.py holds what a trainer can express and the refusals."""

from gpuplan.export.common import ExportRefused, TrainingJob, training_job

__all__ = ["ExportRefused", "TrainingJob", "training_job"]
