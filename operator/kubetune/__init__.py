"""kubetune: hyperparameter tuning on Kubernetes, trials on Ray.

The names below are the trial-side API, what a user's training function calls.
"""
from kubetune.trainable.api import get_checkpoint, get_config, get_context, report

__all__ = ["report", "get_config", "get_checkpoint", "get_context"]
