"""Metrics for acceptance predictors: pure functions on numpy arrays, plus per-position tables.

Depends on no other svt package.
"""

from svt.metrics.calibration import brier, calibration_bins, ece, log_loss
from svt.metrics.ranking import auc_reason, roc_auc

__all__ = ["auc_reason", "brier", "calibration_bins", "ece", "log_loss", "roc_auc"]
