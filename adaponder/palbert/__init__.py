"""PALBERT mode (ALGORITHMS.md section (b)): model-independent parts.

* :mod:`adaponder.palbert.glue` — GLUE TSV loading and tokenizer-agnostic batching.
* :mod:`adaponder.palbert.metrics` — official GLUE metrics in numpy (B8).
* :mod:`adaponder.palbert.pondernet` — λ layer (B3), exit distribution (B4), losses (B5–B7),
  exit rules offline and online (B9, sampling, expectation, always-last, PABEE).

Only torch and numpy are imported.
"""

from adaponder.palbert.glue import (
    GLUE_TASKS,
    GlueDataError,
    GlueExample,
    GlueTaskSpec,
    get_task,
    load_glue,
    load_glue_split,
    read_glue_tsv,
    tokenize_batch,
)
from adaponder.palbert.metrics import glue_metrics, main_metric
from adaponder.palbert.pondernet import (
    ExitController,
    LambdaLayer,
    exit_distribution,
    geometric_prior,
    kl_regulariser,
    pondernet_loss,
    q_exit,
)

__all__ = [
    "GLUE_TASKS",
    "GlueDataError",
    "GlueExample",
    "GlueTaskSpec",
    "get_task",
    "load_glue",
    "load_glue_split",
    "read_glue_tsv",
    "tokenize_batch",
    "glue_metrics",
    "main_metric",
    "ExitController",
    "LambdaLayer",
    "exit_distribution",
    "geometric_prior",
    "kl_regulariser",
    "pondernet_loss",
    "q_exit",
]
