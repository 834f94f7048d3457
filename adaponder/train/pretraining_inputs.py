"""What a pretraining run trains on and what it trains: the prepared data (prepared first when ``data.prepare``
asks for it) and the model with its DeepSpeed config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from adaponder.data import bundled_corpus_dir
from adaponder.data.errors import DataError
from adaponder.data.prepare import prepare
from adaponder.data.training_source import tokenizer_path as run_tokenizer
from adaponder.hub import is_hub_id, resolve_pretrained
from adaponder.modeling import AdaPonderConfigError, AdaPonderForCausalLM

from . import metrics as M
from .config import RunPlan, TrainConfig, TrainConfigError
from .distributed import broadcast_error
from .ds_config import BatchSizes, build_ds_config


def prepare_data(cfg: TrainConfig, rank: int) -> str | None:
    """Collective: prepare ``data.prepare`` into ``data.path`` (rank 0; a failure reaches every rank) unless it is
    prepared already. Returns the tokenizer path: ``data.tokenizer``, the one next to the shards, a local
    backbone's, or None (the bundled one)."""
    path = Path(cfg.data.path)
    if cfg.data.prepare and not (path / "meta.json").is_file():
        err = None
        if rank == 0:
            try:
                inputs = [str(bundled_corpus_dir()) if x == "bundled" else x for x in cfg.data.prepare]
                # Tokenizing takes minutes before the first step: say what and where, then show the bar.
                M.write_console(f"preparing data.prepare {cfg.data.prepare} into {path} (tokenizing; done once, "
                                "reused by later runs)")
                tokenizer = None if cfg.data.train_tokenizer else run_tokenizer(cfg.data, cfg.init.backbone)
                prepare(inputs, path, tokenizer=tokenizer, text_field=cfg.data.text_field,
                        val_fraction=cfg.data.val_fraction, num_workers=cfg.data.prepare_workers,
                        progress=cfg.logging.progress_bar, train_tokenizer=cfg.data.train_tokenizer)
            except (DataError, ValueError) as e:
                err = f"preparing data.prepare into {path}: {e}"
        err = broadcast_error(err)
        if err:
            raise DataError(err)
    return run_tokenizer(cfg.data, cfg.init.backbone)


def _from_backbone(cfg: TrainConfig, rank: int):
    """Continued pretraining (A14): backbone weights from a checkpoint (a local folder, or a hub id through the HF
    cache), fresh gates."""
    mode, overrides = cfg.model_overrides()
    torch.manual_seed(cfg.train.seed)
    try:
        revision = cfg.init.revision if is_hub_id(cfg.init.backbone) else None
        if cfg.init.revision and revision is None and rank == 0:
            M.write_console(f"init.revision {cfg.init.revision} applies to hub ids; {cfg.init.backbone} is a "
                            "local folder, used as it is")
        source = resolve_pretrained(cfg.init.backbone, revision)
        return AdaPonderForCausalLM.from_backbone(str(source), mode=mode, **overrides)
    except (OSError, ValueError, TypeError) as err:
        if isinstance(err, AdaPonderConfigError):
            raise
        raise TrainConfigError([f"init.backbone: cannot load {cfg.init.backbone}: {err}"], cfg.source) from None


def build_pretraining_model(cfg: TrainConfig, plan: RunPlan, rank: int) -> tuple[Any, dict[str, Any]]:
    """``(model, DeepSpeed config)``: the same initial weights on every rank (DeepSpeed also broadcasts them);
    under ZeRO-3 a fresh model is partitioned at construction."""
    batch = BatchSizes.of(plan)
    if cfg.init.backbone:
        model = _from_backbone(cfg, rank)
        ds_config = build_ds_config(cfg.deepspeed, batch, cfg.optim.grad_clip,
                                    sum(p.numel() for p in model.parameters()), cfg.source)
    else:
        config = cfg.model_config()
        with torch.device("meta"):
            n_params = sum(p.numel() for p in AdaPonderForCausalLM(config).parameters())
        ds_config = build_ds_config(cfg.deepspeed, batch, cfg.optim.grad_clip, n_params, cfg.source)
        torch.manual_seed(cfg.train.seed)
        if cfg.deepspeed.zero_stage == 3:
            # Partition at construction (transformers' ZeRO-3 path: zero.Init + gathered weight init).
            from transformers.integrations import HfDeepSpeedConfig  # imports DeepSpeed (seconds): ZeRO-3 only

            hf_ds = HfDeepSpeedConfig(ds_config)  # noqa: F841  (must stay alive while constructing)
            model = AdaPonderForCausalLM._from_config(config)
            del hf_ds
        else:
            model = AdaPonderForCausalLM(config)
    if cfg.deepspeed.activation_checkpointing:
        model.gradient_checkpointing_enable()
    return model, ds_config


__all__ = ["build_pretraining_model", "prepare_data"]
