"""Export to a Hugging Face checkpoint: from a live DeepSpeed engine, or offline from a training checkpoint.

The folder holds ``config.json`` (with ``auto_map``), the weights (safetensors), the modeling code (so
``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` works without adaponder) and the
tokenizer (``PreTrainedTokenizerFast``), so ``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True``
loads it directly.

An offline export (:func:`export_checkpoint`) first checks the checkpoint (every file's recorded size and
SHA-256; every ``.pt`` unpickled weights-only before ``zero_to_fp32`` sees it), refuses a non-empty output
folder unless ``overwrite``, and writes into a temporary sibling folder ``.NAME.tmp-<pid>`` that replaces the
output folder only once complete; temporary folders of killed exports (their process gone) are removed. An output
folder given as a symbolic link is written through it: its target is replaced, the link kept.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedTokenizerFast

from adaponder.errors import OutputError, write_failure_reason
from adaponder.data.tokenizer import load_tokenizer
from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM
from adaponder.run_lock import pid_alive

from . import metrics as M
from .checkpoint import CheckpointError, check_pickles, fsync_dir, read_state, safe_torch_load, verify_files
from .finite_weights import NonFiniteWeightsError, first_nonfinite


def save_tokenizer(out_dir: str | Path, tokenizer_path: str | None = None) -> bool:
    """Save the training tokenizer as a ``PreTrainedTokenizerFast`` into ``out_dir`` (HF tokenizers JSON only).

    Returns False (and saves nothing) for a sentencepiece tokenizer.
    """
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


class ExportError(RuntimeError):
    """The output folder cannot be written as asked (not empty without ``overwrite``, holds the checkpoint...)."""


def export_engine(engine, zero3: bool, rank: int, out_dir: Path, tokenizer_path: str | None,
                  extra: dict[str, Any]) -> None:
    """Collective. The Hugging Face export of a live engine's weights (gathered from the ZeRO-3 shards when
    ``zero3``), written by rank 0 atomically over an earlier one (:func:`write_atomically`)."""
    if zero3:
        sd = engine._zero3_consolidated_16bit_state_dict()
    else:
        sd = {k: v.detach().cpu() for k, v in engine.module.state_dict().items()} if rank == 0 else None
    if rank == 0:
        write_atomically(out_dir, lambda tmp: save_hf(engine.module, sd, tmp, tokenizer_path, extra), overwrite=True)
        M.write_console(f"exported Hugging Face checkpoint: {out_dir}")
    if dist.is_initialized():
        dist.barrier()


def state_dict_from_checkpoint(tag_dir: str | Path, verify: bool = True) -> dict[str, torch.Tensor]:
    """fp32 weights of a training checkpoint folder (``stepNNNNNNNN``), consolidated from ZeRO shards.

    With ``verify`` the files must have their recorded sizes and SHA-256 first; every ``.pt`` is unpickled
    weights-only (DeepSpeed's types allowed) before DeepSpeed's ``zero_to_fp32`` loads it unrestricted."""
    tag_dir = Path(tag_dir)
    state = read_state(tag_dir)
    if verify:
        verify_files(tag_dir, state, "cannot export")
    stage = int(state.get("compat", {}).get("zero_stage", 0))
    if stage == 0:
        f = tag_dir / "mp_rank_00_model_states.pt"
        sd = safe_torch_load(f)["module"]
        return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
    check_pickles(tag_dir)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # DeepSpeed is heavy: ZeRO-3 only

    try:
        return get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    except Exception as err:
        raise CheckpointError(f"{tag_dir}: cannot consolidate the ZeRO-{stage} shards ({type(err).__name__}: {err})") from None


def check_output_dir(out_dir: str | Path, overwrite: bool = False, protect: Path | None = None) -> Path:
    """The absolute output folder, after refusing a file, a non-empty folder (unless ``overwrite``), and a
    folder that holds (or is inside) ``protect`` — replacing it would delete the checkpoint being exported.
    A symbolic link stands for its target: the export replaces the target folder and the link stays."""
    out = Path(os.path.abspath(out_dir))
    if out.is_symlink():
        out = Path(os.path.realpath(out))
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: exists and is not a folder; expected an empty or new output folder")
    if protect is not None:
        src = Path(os.path.abspath(protect))
        if out == src or out in src.parents or src in out.parents:
            raise ExportError(f"{out}: the output folder must lie outside the checkpoint {src} "
                              "(replacing it would delete the checkpoint)")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out}: the output folder is not empty; expected an empty or new folder "
                          "(pass --overwrite to replace it)")
    return out


def _remove_stale(out: Path) -> None:
    """Remove the ``.NAME.tmp-<pid>`` / ``.NAME.old-<pid>`` folders beside ``out`` of exports that were killed
    (their process is gone; this one's own are stale too). A live export's are left alone."""
    for path in out.parent.glob(f".{out.name}.*"):
        m = re.fullmatch(re.escape(f".{out.name}.") + r"(?:tmp|old)-(\d+)", path.name)
        if m and path.is_dir() and (int(m.group(1)) == os.getpid() or not pid_alive(int(m.group(1)))):
            shutil.rmtree(path, ignore_errors=True)


def write_atomically(out_dir: str | Path, write, overwrite: bool = False) -> Path:
    """``write(folder)`` into ``.NAME.tmp-<pid>`` next to ``out_dir``, then rename it to ``out_dir``. An existing
    ``out_dir`` (empty, or any with ``overwrite``) is first renamed aside to ``.NAME.old-<pid>`` and deleted
    only once the new folder is in place; a failure while writing leaves ``out_dir`` as it was. When ``out_dir``
    is a symbolic link, all of this happens beside its target, so the link keeps pointing at the new folder."""
    out = check_output_dir(out_dir, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    _remove_stale(out)
    tmp.mkdir()
    try:
        try:
            write(tmp)
        except (OSError, RuntimeError) as err:
            reason = write_failure_reason(err, tmp)
            if reason is None:
                raise
            raise OutputError(f"could not write the export {out} ({reason}); {out} was left as it was") from err
        check_output_dir(out, overwrite)  # something may have appeared there meanwhile
        moved = False
        if out.exists():
            os.replace(out, old)
            moved = True
        try:
            os.replace(tmp, out)
        except OSError:
            if moved:
                os.replace(old, out)  # put the previous folder back
            raise
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return out


def export_checkpoint(tag_dir: str | Path, out_dir: str | Path, dtype: str = "fp32", overwrite: bool = False) -> Path:
    """Offline export of a training checkpoint folder to a Hugging Face folder (checked first: see above)."""
    tag_dir = Path(tag_dir)
    check_output_dir(out_dir, overwrite, protect=tag_dir.parent)  # before any work
    state = read_state(tag_dir)
    verify_files(tag_dir, state, "cannot export")
    config = AdaPonderConfig.from_dict(json.loads((tag_dir / "config.json").read_text(encoding="utf-8")))
    sd = state_dict_from_checkpoint(tag_dir, verify=False)
    found = first_nonfinite(sd.items())
    if found:  # (an export is what evaluation and users load: it must not carry NaN weights silently)
        raise NonFiniteWeightsError(f"cannot export {tag_dir}: its weights are not all finite ({found}); export an "
                                    "earlier checkpoint (the newest one with finite weights is kept by rotation)")
    model = AdaPonderForCausalLM(config)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"{tag_dir}: weights do not fit the model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    model = model.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    extra = {"source_checkpoint": str(tag_dir.resolve()), "step": state.get("step"),
             "tokens_seen": state.get("tokens_seen")}
    return write_atomically(out_dir, lambda tmp: save_hf(model, None, tmp, state.get("tokenizer"), extra), overwrite)


__all__ = ["export_engine", "save_hf", "save_tokenizer", "state_dict_from_checkpoint", "export_checkpoint",
           "ExportError", "check_output_dir", "write_atomically"]
