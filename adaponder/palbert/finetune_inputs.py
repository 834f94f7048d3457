"""What a GLUE fine-tuning run starts from: the tokenizer, where the GLUE data is read from, the checkpoint of
``--init`` (a folder, a hub id, or a random ``tiny`` core) and the classifier built on it."""

from __future__ import annotations

import os
import random

import torch

from adaponder.core_modes import classifier_core_mode
from adaponder.data.tokenizer import Tokenizer, load_tokenizer
from adaponder.hub import HubError, resolve_pretrained
from adaponder.modeling import AdaPonderForCausalLM, pythia_config
from adaponder.palbert.classifier import AdaPonderForSequenceClassification
from adaponder.palbert.config import FinetuneConfig
from adaponder.palbert.glue import GlueDataError, GlueTaskSpec

#: ``--init`` of a randomly initialised ``tiny`` preset core (smoke runs).
TINY_RANDOM = "tiny-random"


# --------------------------------------------------------------------------------------------- tokenizer


def load_glue_tokenizer(path: str | None = None) -> Tokenizer:
    """The project tokenizer (:func:`adaponder.data.tokenizer.load_tokenizer`; the bundled Pythia /
    GPT-NeoX-20B tokenizer by default); ``data.sep``/``data.suffix`` become ids with :meth:`Tokenizer.ids_of`."""
    return load_tokenizer(path)


def default_glue_dir() -> str:
    """``$ADAPONDER_GLUE_DIR``, else ``$ADAPONDER_SHARED_DATA/glue``; neither set is a :class:`GlueDataError`
    (the package never guesses a location outside the checkout)."""
    if os.environ.get("ADAPONDER_GLUE_DIR"):
        return os.environ["ADAPONDER_GLUE_DIR"]
    if os.environ.get("ADAPONDER_SHARED_DATA"):
        return os.path.join(os.environ["ADAPONDER_SHARED_DATA"], "glue")
    raise GlueDataError("GLUE data folder", None, "not given: pass --data-dir DIR (DIR/<Task>/{train,dev}.tsv) "
                        "or set ADAPONDER_GLUE_DIR, or read GLUE through datasets (--hf-dataset / data.hf_dataset)")


def glue_tsv_dir(data_dir: str | None, hf_dataset: str | None) -> str | None:
    """The TSV folder a run reads GLUE from, or None when ``hf_dataset`` (``data.hf_dataset`` / ``--hf-dataset``)
    names a ``datasets`` source instead. Both sources given is an error; neither falls back to
    :func:`default_glue_dir` (``$ADAPONDER_GLUE_DIR`` is only a default, so it never conflicts)."""
    if hf_dataset:
        if data_dir:
            raise GlueDataError("GLUE data", None, f"both a TSV folder ({data_dir}) and a datasets source "
                                f"({hf_dataset}) given; use one: --data-dir or --hf-dataset / data.hf_dataset")
        return None
    return data_dir or default_glue_dir()


def resolve_init(init: str, revision: str | None = None) -> str:
    """The checkpoint folder of ``init``: a local folder, or a Hugging Face hub id at ``revision`` resolved through
    the cache (:func:`adaponder.hub.resolve_pretrained`; a :class:`~adaponder.hub.HubError` names what is
    missing). :data:`TINY_RANDOM` is returned as it is."""
    if init == TINY_RANDOM:
        if revision:
            raise HubError(f"a revision ({revision}) applies to a Hugging Face hub id, not to {TINY_RANDOM}")
        return init
    return str(resolve_pretrained(init, revision))


# ------------------------------------------------------------------------------------------------- model


def build_classifier(cfg: FinetuneConfig, init: str, spec: GlueTaskSpec, seed: int = 0
                     ) -> AdaPonderForSequenceClassification:
    """The classifier of ``cfg.model`` on the core of ``init`` (a checkpoint directory, or :data:`TINY_RANDOM`
    for the ``tiny`` preset randomly initialised, shape overrides from ``model.random_shape``)."""
    m, lo = cfg.model, cfg.loss
    fields = dict(pooler=m.pooler, classifier_dropout=m.classifier_dropout, lambda_layers=m.lambda_layers,
                  lambda_dropout=m.lambda_dropout, lambda_init_bias=m.lambda_init_bias, ponder_beta=lo.beta,
                  ponder_lambda_p=lo.lambda_p, kl_direction=lo.kl_direction)
    torch.manual_seed(seed)
    if init == TINY_RANDOM:
        mode = classifier_core_mode(m.core_mode or "ponderlm")
        shape = {"passes": 1} if mode != "vanilla" else {}
        source = AdaPonderForCausalLM(pythia_config("tiny", mode=mode, **{**shape, **m.random_shape}))
    else:
        source, mode = init, m.core_mode
    model = AdaPonderForSequenceClassification.from_backbone(
        source, num_labels=spec.num_labels, palbert_method=m.method, palbert_passes=m.passes, mode=mode,
        attn_implementation=m.attn_implementation, **fields)
    return model


def subset(examples, k: int, seed: int):
    """``k`` examples drawn with ``Random(seed)`` in their original order (all of them for ``k`` 0 or too large)."""
    if not k or k >= len(examples):
        return list(examples)
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return [examples[i] for i in sorted(order[:k])]


__all__ = ["TINY_RANDOM", "build_classifier", "default_glue_dir", "glue_tsv_dir",
           "load_glue_tokenizer", "resolve_init", "subset"]
