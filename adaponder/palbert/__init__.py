"""PALBERT mode (docs/method.md section (b)): model-independent parts.

* :mod:`adaponder.palbert.glue` — GLUE TSV loading and tokenizer-agnostic batching.
* :mod:`adaponder.palbert.metrics` — official GLUE metrics: scikit-learn / scipy calls (B8).
* :mod:`adaponder.palbert.pondernet` — λ layer (B3), exit distribution (B4), losses (B5–B7),
  exit rules offline and online (B9, sampling, expectation, always-last, PABEE).
* :mod:`adaponder.palbert.classifier` — ``AdaPonderForSequenceClassification`` on the recurrent core
  (B1–B7) with online early exit (``predict``), and ``PalbertConfig``.
* :mod:`adaponder.palbert.config` / :mod:`adaponder.palbert.finetune` — the typed fine-tuning config and
  the GLUE recipe behind ``launch/finetune_glue.py`` (B8), on the run harness of pretraining
  (:mod:`adaponder.train.harness`: process group, DeepSpeed engine, checkpoints and resume checks, metrics sink,
  signal handling); :mod:`adaponder.palbert.finetune_inputs` (tokenizer, GLUE source, classifier) and
  :mod:`adaponder.palbert.finetune_phases` (the evaluation phases and results files).
* :mod:`adaponder.palbert.rule_evaluation` / :mod:`adaponder.palbert.results` — every exit rule's dev metrics
  and timing from one N-pass forward, and the run's results table.

Importing the package imports only torch and numpy; the model and recipe names below load their modules
(and transformers, DeepSpeed, scikit-learn, scipy) on first use.
"""

from adaponder._lazy import lazy_getattr

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

_LAZY = {
    "AdaPonderForSequenceClassification": "adaponder.palbert.classifier",
    "PalbertConfig": "adaponder.palbert.classifier",
    "FinetuneConfig": "adaponder.palbert.config",
    "FinetuneConfigError": "adaponder.palbert.config",
    "load_finetune_config": "adaponder.palbert.config",
    "run_finetune": "adaponder.palbert.finetune",
}
__all__ += list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
