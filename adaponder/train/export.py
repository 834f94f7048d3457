"""Export to a Hugging Face checkpoint: from a live DeepSpeed engine, or offline from a training checkpoint.

The folder holds ``config.json`` (with ``auto_map``), the weights (safetensors), the modeling code (so
``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` works without adaponder) and the
tokenizer (``PreTrainedTokenizerFast``), so ``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True``
loads it directly.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import torch


def save_tokenizer(out_dir: str | Path, tokenizer_path: str | None = None) -> bool:
    """Save the training tokenizer as a ``PreTrainedTokenizerFast`` into ``out_dir`` (HF tokenizers JSON only).

    Returns False (and saves nothing) for a sentencepiece tokenizer.
    """
    from transformers import PreTrainedTokenizerFast

    from adaponder.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_path)
    if tok.kind != "hf":
        return False
    src = Path(tok.source)
    raw = src.read_bytes()
    if src.suffix == ".gz":
        raw = gzip.decompress(raw)
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "tokenizer.json"
        f.write_bytes(raw)
        eos = tok.id_to_token(tok.eod_id)
        pad = tok.id_to_token(tok.pad_id)
        hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(f), eos_token=eos, bos_token=eos, pad_token=pad)
        hf_tok.save_pretrained(str(out_dir))
    return True


def save_hf(model, state_dict: dict[str, torch.Tensor] | None, out_dir: str | Path,
            tokenizer_path: str | None = None, extra: dict[str, Any] | None = None) -> Path:
    """``model.save_pretrained`` (with ``state_dict`` when the module's own tensors are partitioned) plus
    the tokenizer and an ``adaponder_training.json`` describing where the weights came from."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {"state_dict": state_dict} if state_dict is not None else {}
    model.save_pretrained(str(out), safe_serialization=True, **kwargs)
    save_tokenizer(out, tokenizer_path)
    if extra:
        (out / "adaponder_training.json").write_text(json.dumps(extra, indent=2, sort_keys=True, default=str),
                                                      encoding="utf-8")
    return out


def state_dict_from_checkpoint(tag_dir: str | Path) -> dict[str, torch.Tensor]:
    """fp32 weights of a training checkpoint folder (``stepNNNNNNNN``), consolidated from ZeRO shards."""
    from .checkpoint import CheckpointError, read_state

    tag_dir = Path(tag_dir)
    state = read_state(tag_dir)
    stage = int(state.get("compat", {}).get("zero_stage", 0))
    if stage == 0:
        f = tag_dir / "mp_rank_00_model_states.pt"
        sd = torch.load(f, map_location="cpu", weights_only=False)["module"]
        return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    try:
        return get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    except Exception as err:
        raise CheckpointError(f"{tag_dir}: cannot consolidate the ZeRO-{stage} shards ({type(err).__name__}: {err})") from None


def export_checkpoint(tag_dir: str | Path, out_dir: str | Path, dtype: str = "fp32") -> Path:
    """Offline export of a training checkpoint folder to a Hugging Face folder."""
    from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM

    from .checkpoint import read_state

    tag_dir = Path(tag_dir)
    state = read_state(tag_dir)
    config = AdaPonderConfig.from_dict(json.loads((tag_dir / "config.json").read_text(encoding="utf-8")))
    sd = state_dict_from_checkpoint(tag_dir)
    model = AdaPonderForCausalLM(config)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"{tag_dir}: weights do not fit the model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    model = model.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    extra = {"source_checkpoint": str(tag_dir.resolve()), "step": state.get("step"),
             "tokens_seen": state.get("tokens_seen")}
    return save_hf(model, None, out_dir, state.get("tokenizer"), extra)


__all__ = ["save_hf", "save_tokenizer", "state_dict_from_checkpoint", "export_checkpoint"]
