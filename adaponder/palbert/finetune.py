"""GLUE fine-tuning in PALBERT mode (docs/method.md (b), B8) and the evaluation of every exit rule.

:func:`run_finetune` is the whole recipe behind ``launch/finetune_glue.py``:

1. load the GLUE TSVs and tokenise once (``text_a <sep> text_b <suffix>``, B8: max length 128);
2. build :class:`~adaponder.palbert.classifier.AdaPonderForSequenceClassification` on the ``--init`` core;
3. train with Adam, constant LR, a separate Lambda-layer LR (B8), batch 32; evaluate on dev every
   ``eval_every`` steps (or epoch) and stop early on the dev main metric under the selection rule
   (Q-exit by default), restoring the best weights;
4. evaluate every exit rule on dev from one N-pass forward (metric, mean exit pass, speed-up N / mean
   exit pass, exit histogram), check the online (early-exit) path against it, and measure time per
   example with early exit vs always-last at batch 1 and 32;
5. write ``results.json`` and ``results.md`` to the output directory.

Single process by default; under the ``deepspeed`` launcher (``WORLD_SIZE > 1`` or ``--deepspeed``) the
training steps run through a DeepSpeed engine (ZeRO stage from the config's ``deepspeed`` section,
data parallel over ranks), and rank 0 evaluates and writes the results.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adaponder.palbert.classifier import (
    AdaPonderForSequenceClassification,
    PalbertOutput,
    offline_exit,
    predictions_from_outputs,
    rules_for_method,
)
from adaponder.palbert.config import FinetuneConfig
from adaponder.palbert.glue import (
    GlueTaskSpec,
    encode_examples,
    get_task,
    load_glue_split,
    majority_baseline,
    pad_batch,
)
from adaponder.palbert.metrics import glue_metrics

__all__ = [
    "GlueTokenizer",
    "load_glue_tokenizer",
    "default_glue_dir",
    "build_classifier",
    "forward_all",
    "evaluate_rules",
    "time_rules",
    "run_finetune",
    "results_markdown",
]

RULE_NAMES = {"q": "Q-exit", "sample": "sampling", "expectation": "expectation", "last": "always-last",
              "pabee": "PABEE"}


# --------------------------------------------------------------------------------------------- tokenizer


@dataclass
class GlueTokenizer:
    """What GLUE batching needs from a tokenizer."""

    encode: Callable[[str], list[int]]
    token_to_id: Callable[[str], int | None]
    pad_id: int
    eod_id: int
    name: str

    def ids(self, token_or_text: str) -> list[int]:
        """A special token by name (``<|endoftext|>``) → its id; other text → its encoding; ``""`` → none."""
        if not token_or_text:
            return []
        tid = self.token_to_id(token_or_text)
        return [tid] if tid is not None else list(self.encode(token_or_text))


def load_glue_tokenizer(path: str | None = None) -> GlueTokenizer:
    """The project tokenizer (``adaponder.data.tokenizer``; bundled Pythia/GPT-NeoX-20B by default), or —
    if that module is unavailable — the shared ``tokenizer.json`` through ``tokenizers`` directly."""
    try:
        from adaponder.data.tokenizer import load_tokenizer
    except ImportError:  # pragma: no cover - the fallback while the data package is absent
        load_tokenizer = None
    if load_tokenizer is not None:
        tok = load_tokenizer(path)
        return GlueTokenizer(tok.encode, tok.token_to_id, tok.pad_id, tok.eod_id, tok.name)
    from tokenizers import Tokenizer

    file = path or str(Path(__file__).resolve().parents[3] / "shared/data/tokenizers/gpt-neox-20b/tokenizer.json")
    tok = Tokenizer.from_file(file)
    eod = tok.token_to_id("<|endoftext|>")
    pad = tok.token_to_id("<|padding|>")
    return GlueTokenizer(lambda s: tok.encode(s, add_special_tokens=False).ids, tok.token_to_id,
                         pad if pad is not None else eod, eod, Path(file).parent.name)


def default_glue_dir() -> str:
    """``$ADAPONDER_GLUE_DIR``, else ``$ADAPONDER_SHARED_DATA/glue``, else ``<repo>/../shared/data/glue``."""
    if os.environ.get("ADAPONDER_GLUE_DIR"):
        return os.environ["ADAPONDER_GLUE_DIR"]
    if os.environ.get("ADAPONDER_SHARED_DATA"):
        return os.path.join(os.environ["ADAPONDER_SHARED_DATA"], "glue")
    return str(Path(__file__).resolve().parents[2].parent / "shared" / "data" / "glue")


# ------------------------------------------------------------------------------------------------- model


def build_classifier(cfg: FinetuneConfig, init: str, spec: GlueTaskSpec, seed: int = 0
                     ) -> AdaPonderForSequenceClassification:
    """The classifier of ``cfg.model`` on the core of ``init`` (a checkpoint directory, or ``tiny-random``
    for the ``tiny`` preset randomly initialised, shape overrides from ``model.random_shape``)."""
    from adaponder.modeling import AdaPonderForCausalLM, pythia_config

    m, lo = cfg.model, cfg.loss
    fields = dict(pooler=m.pooler, classifier_dropout=m.classifier_dropout, lambda_layers=m.lambda_layers,
                  lambda_dropout=m.lambda_dropout, lambda_init_bias=m.lambda_init_bias, ponder_beta=lo.beta,
                  ponder_lambda_p=lo.lambda_p, kl_direction=lo.kl_direction)
    torch.manual_seed(seed)
    if init == "tiny-random":
        mode = m.core_mode or "ponderlm"
        mode = "ponderlm" if mode == "adaponder" else mode
        shape = {"passes": 1} if mode != "vanilla" else {}
        source = AdaPonderForCausalLM(pythia_config("tiny", mode=mode, **{**shape, **m.random_shape}))
    else:
        source, mode = init, m.core_mode
    model = AdaPonderForSequenceClassification.from_backbone(
        source, num_labels=spec.num_labels, palbert_method=m.method, palbert_passes=m.passes, mode=mode, **fields)
    model.config._attn_implementation = m.attn_implementation
    model.core.config._attn_implementation = m.attn_implementation
    return model


# ---------------------------------------------------------------------------------------------- evaluation


def _batches(ids: Sequence[Sequence[int]], labels: Sequence, batch_size: int, pad_id: int, order=None):
    idx = list(range(len(ids))) if order is None else list(order)
    for start in range(0, len(idx), batch_size):
        chunk = idx[start:start + batch_size]
        yield pad_batch([ids[i] for i in chunk], [labels[i] for i in chunk], pad_id=pad_id)


@torch.no_grad()
def forward_all(model: AdaPonderForSequenceClassification, ids: Sequence[Sequence[int]], labels: Sequence,
                batch_size: int, pad_id: int) -> PalbertOutput:
    """All N passes for every example (eval mode, no early exit): per-pass outputs, λ, p, concatenated."""
    was = model.training
    model.eval()
    parts: dict[str, list[torch.Tensor]] = {"pass_logits": [], "lambda_logits": [], "lambdas": [], "p": []}
    device = _device_of(model)
    try:
        for batch in _batches(ids, labels, batch_size, pad_id):
            out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
            for key in parts:
                val = getattr(out, key)
                if val is not None:
                    parts[key].append(val.float().cpu())
    finally:
        model.train(was)
    cat = {k: torch.cat(v) if v else None for k, v in parts.items()}
    return PalbertOutput(logits=cat["pass_logits"][:, -1], **cat)


def _rule_stats(task: str, outputs: torch.Tensor, exit_idx: torch.Tensor, labels: Sequence, n: int,
                regression: bool) -> dict[str, Any]:
    preds = predictions_from_outputs(outputs, regression)
    metrics = glue_metrics(task, preds.numpy(), list(labels))
    mean_exit = float((exit_idx + 1).float().mean())
    hist = torch.bincount(exit_idx, minlength=n).tolist()
    return {"metrics": metrics, "mean_exit_pass": mean_exit, "speedup": n / mean_exit, "exit_histogram": hist}


def evaluate_rules(model: AdaPonderForSequenceClassification, out: PalbertOutput, labels: Sequence,
                   spec: GlueTaskSpec, rules: Sequence[str], *, q: float, patience: int, sample_draws: int = 1,
                   seed: int = 0) -> dict[str, dict[str, Any]]:
    """Every rule's dev metrics from one offline forward (identical to online early exit, see tests).

    ``sample`` is averaged over ``sample_draws`` seeded draws (metrics and exit passes; ``draws`` keeps each).
    """
    cfg = model.config
    n = cfg.palbert_passes
    main = spec.main_metric
    res: dict[str, dict[str, Any]] = {}
    for rule in rules:
        kw = dict(q=q, patience=patience, regression=cfg.is_regression,
                  regression_threshold=cfg.pabee_regression_threshold)
        if rule == "sample":
            draws = []
            for k in range(sample_draws):
                gen = _generator(out.pass_logits.device, seed * 1000 + k)
                outputs, idx = offline_exit(out, rule, generator=gen, **kw)
                draws.append(_rule_stats(spec.name, outputs, idx, labels, n, cfg.is_regression))
            stats = {
                "metrics": {k: float(sum(d["metrics"][k] for d in draws) / len(draws)) for k in draws[0]["metrics"]},
                "mean_exit_pass": sum(d["mean_exit_pass"] for d in draws) / len(draws),
                "exit_histogram": [sum(d["exit_histogram"][i] for d in draws) / len(draws) for i in range(n)],
                "draws": [d["metrics"][main] for d in draws],
            }
            stats["speedup"] = n / stats["mean_exit_pass"]
        else:
            outputs, idx = offline_exit(out, rule, **kw)
            stats = _rule_stats(spec.name, outputs, idx, labels, n, cfg.is_regression)
        stats["main"] = float(stats["metrics"][main])
        res[rule] = stats
    return res


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _predict_all(model, batches, rule, q, patience, seed=0):
    device = _device_of(model)
    gen = _generator(device, seed)
    preds, exits = [], []
    for batch in batches:
        r = model.predict(batch["input_ids"].to(device), batch["attention_mask"].to(device), rule, q=q,
                          patience=patience, generator=gen)
        preds.append(r.outputs.float().cpu())
        exits.append(r.exit_pass.cpu())
    return torch.cat(preds), torch.cat(exits)


def time_rules(model: AdaPonderForSequenceClassification, ids: Sequence[Sequence[int]], pad_id: int, *,
               rules: Sequence[str], batch_sizes: Sequence[int], repeats: int, q: float, patience: int,
               threads: int = 0) -> dict[str, Any]:
    """Measured time per example of online inference with each rule vs always-last (B9: passes after the
    exit are not computed).

    Every batch is run ``repeats`` times with each rule, the rules interleaved, after one untimed warm-up;
    a batch's time is its fastest run and a rule's time is the sum over batches — so a stall caused by
    other processes hits no rule more than another. ``threads`` (0 = unchanged) sets torch's intra-op
    threads meanwhile; 1 is the most stable on a shared machine. ``ratio_to_ideal`` = measured speed-up
    (t_last / t_rule) / ideal speed-up (N / mean exit pass).
    """
    n = model.config.palbert_passes
    rules = list(dict.fromkeys([*rules, "last"]))
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    model.eval()
    device = _device_of(model)
    out: dict[str, Any] = {"examples": len(ids), "threads": torch.get_num_threads(), "repeats": repeats,
                           "device": str(device)}
    try:
        for bs in batch_sizes:
            batches = [{k: v.to(device) for k, v in b.items()} for b in _batches(ids, [0] * len(ids), bs, pad_id)]
            total = {r: 0.0 for r in rules}
            exits: dict[str, list[torch.Tensor]] = {r: [] for r in rules}
            for bi, batch in enumerate(batches):
                best = {r: math.inf for r in rules}
                for rep in range(repeats + 1):  # round 0 warms up and is not timed
                    for rule in rules:
                        gen = _generator(device, bi)
                        _sync(device)
                        t0 = time.perf_counter()
                        res = model.predict(batch["input_ids"], batch["attention_mask"], rule, q=q,
                                            patience=patience, generator=gen)
                        _sync(device)
                        dt = time.perf_counter() - t0
                        if rep == 0:
                            exits[rule].append(res.exit_pass.cpu())
                        else:
                            best[rule] = min(best[rule], dt)
                for rule in rules:
                    total[rule] += best[rule]
            entry: dict[str, Any] = {}
            for rule in rules:
                mean_exit = float(torch.cat(exits[rule]).float().mean())
                measured = total["last"] / total[rule]
                ideal = n / mean_exit
                entry[rule] = {"sec_per_example": total[rule] / len(ids), "mean_exit_pass": mean_exit,
                               "measured_speedup": measured, "ideal_speedup": ideal,
                               "ratio_to_ideal": measured / ideal}
            out[f"batch_{bs}"] = entry
    finally:
        torch.set_num_threads(old_threads)
    return out


# -------------------------------------------------------------------------------------------- distributed


class _Dist:
    """Rank/world of a DeepSpeed (or torchrun) launch; single process when ``WORLD_SIZE`` is unset/1."""

    def __init__(self, use_deepspeed: bool):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.enabled = use_deepspeed or self.world > 1
        self.engine = None
        if self.enabled:
            import deepspeed
            from deepspeed.accelerator import get_accelerator

            deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
            import torch.distributed as dist

            self.world, self.rank = dist.get_world_size(), dist.get_rank()

    @property
    def main(self) -> bool:
        return self.rank == 0

    def wrap(self, model, optimizer, ds_config: dict, batch_size: int, grad_clip: float):
        if not self.enabled:
            return model, optimizer
        import deepspeed

        if batch_size % self.world:
            raise ValueError(f"train.batch_size={batch_size} must be divisible by the world size {self.world}")
        conf = copy.deepcopy(ds_config)
        conf.update(train_batch_size=batch_size, train_micro_batch_size_per_gpu=batch_size // self.world,
                    gradient_accumulation_steps=1)
        if grad_clip > 0:
            conf["gradient_clipping"] = grad_clip
        conf.setdefault("steps_per_print", 10**9)
        self.engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=conf)
        return self.engine, optimizer

    def shard(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return batch if not self.enabled else {k: v[self.rank::self.world] for k, v in batch.items()}

    def broadcast(self, obj):
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_finite(self, loss: torch.Tensor) -> bool:
        ok = torch.tensor([float(torch.isfinite(loss.detach()).all())])
        if self.enabled:
            import torch.distributed as dist

            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return bool(ok.item() > 0)

    def barrier(self):
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()


# ---------------------------------------------------------------------------------------------- training


def _seed_all(seed: int):
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _subset(examples, k: int, seed: int):
    if not k or k >= len(examples):
        return list(examples)
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return [examples[i] for i in sorted(order[:k])]


def run_finetune(cfg: FinetuneConfig, *, init: str, data_dir: str | None = None, output: str | Path,
                 use_deepspeed: bool = False, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Fine-tune, evaluate every exit rule, time early exit, and write ``results.json``/``results.md``.

    Returns the results dict (``None`` on ranks other than 0 of a distributed run).
    """
    threads = torch.get_num_threads()
    try:
        return _run_finetune(cfg, init, data_dir, output, use_deepspeed, log)
    finally:
        torch.set_num_threads(threads)


def _run_finetune(cfg, init, data_dir, output, use_deepspeed, log):
    t_start = time.time()
    dist = _Dist(use_deepspeed)
    output = Path(output)
    if dist.main:
        output.mkdir(parents=True, exist_ok=True)
    tcfg, ecfg, mcfg = cfg.train, cfg.eval, cfg.model
    spec = get_task(cfg.task)
    data_dir = data_dir or default_glue_dir()
    _seed_all(tcfg.seed)
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)

    # -- data ------------------------------------------------------------------------------------
    tok = load_glue_tokenizer(cfg.data.tokenizer)
    train_full = load_glue_split(data_dir, spec, "train")
    dev_full = load_glue_split(data_dir, spec, "dev")
    train = _subset(train_full, tcfg.max_examples, tcfg.seed)
    dev = _subset(dev_full, ecfg.max_examples, 0)
    enc_kw = dict(sep_ids=tok.ids(cfg.data.sep), suffix_ids=tok.ids(cfg.data.suffix), max_length=cfg.data.max_length)
    encode = lambda s: tok.encode(s.strip())  # noqa: E731  (SST-2 sentences end in a space)
    train_ids = encode_examples(train, encode, **enc_kw)
    dev_ids = encode_examples(dev, encode, **enc_kw)
    train_y = [ex.label for ex in train]
    dev_y = [ex.label for ex in dev]
    log(f"[palbert] {spec.name}: train {len(train)}/{len(train_full)}, dev {len(dev)}/{len(dev_full)}; "
        f"init {init}; method {mcfg.method}, N={mcfg.passes}; world {dist.world}")

    # -- model and optimizer (B8) ----------------------------------------------------------------
    model = build_classifier(cfg, init, spec, seed=tcfg.seed)
    if not dist.enabled:  # under DeepSpeed the engine places the model
        model.to(_resolve_device(tcfg.device))
    model.train()
    method = model.config.palbert_method
    rules = [r for r in ecfg.rules if r in rules_for_method(method)]
    select_rule = cfg.select_rule
    if select_rule not in rules:
        rules.append(select_rule)
    optimizer = torch.optim.Adam(model.param_groups(tcfg.lr, tcfg.lambda_lr, tcfg.weight_decay))
    engine, optimizer = dist.wrap(model, optimizer, cfg.deepspeed, tcfg.batch_size, tcfg.grad_clip)
    params = [p for g in optimizer.param_groups for p in g["params"]]

    steps_per_epoch = len(train) // tcfg.batch_size if dist.enabled else math.ceil(len(train) / tcfg.batch_size)
    if steps_per_epoch < 1:
        raise ValueError(f"{len(train)} training examples do not fill one batch of {tcfg.batch_size}")
    total_steps = max(1, int(round(tcfg.epochs * steps_per_epoch)))
    if tcfg.max_steps:
        total_steps = min(total_steps, tcfg.max_steps)
    eval_every = tcfg.eval_every or steps_per_epoch
    main = spec.main_metric

    def dev_eval() -> dict[str, dict[str, Any]]:
        out = forward_all(model, dev_ids, dev_y, ecfg.batch_size, tok.pad_id)
        return evaluate_rules(model, out, dev_y, spec, [select_rule, "last"] if select_rule != "last" else ["last"],
                              q=ecfg.q, patience=ecfg.patience, sample_draws=1, seed=tcfg.seed)

    history: list[dict[str, Any]] = []
    best_score, best_step, best_state, bad_evals = -math.inf, 0, None, 0
    step, epoch, stopped_early, running = 0, 0, False, []
    rng = random.Random(tcfg.seed)
    while step < total_steps and not stopped_early:
        order = list(range(len(train)))
        rng.shuffle(order)
        for batch in _batches(train_ids, train_y, tcfg.batch_size, tok.pad_id, order):
            if dist.enabled and batch["input_ids"].shape[0] < tcfg.batch_size:
                continue  # data parallel: every rank needs an equal shard
            device = _device_of(model)
            batch = {k: v.to(device) for k, v in dist.shard(batch).items()}
            out = (engine or model)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                     labels=batch["labels"])
            loss = out.loss
            if not dist.all_finite(loss):  # stop before the optimizer step (STYLE 7)
                raise FloatingPointError(f"non-finite loss {loss.item()} at step {step + 1}")
            if dist.engine is not None:
                dist.engine.backward(loss)
                dist.engine.step()
            else:
                loss.backward()
                if tcfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            step += 1
            running.append(float(loss.detach()))
            if tcfg.log_every and step % tcfg.log_every == 0 and dist.main:
                extra = "" if out.rec is None else f" (rec {float(out.rec):.4f}, reg {float(out.reg):.4f})"
                recent = running[-tcfg.log_every:]
                log(f"[palbert] step {step}/{total_steps} loss {sum(recent) / len(recent):.4f}{extra}")
            if step % eval_every == 0 or step == total_steps:
                decision = None
                if dist.main:
                    res = dev_eval()
                    score = res[select_rule]["main"]
                    entry = {"step": step, "epoch": epoch + 1, "train_loss": sum(running) / len(running),
                             "dev": {r: {"main": v["main"], "mean_exit_pass": v["mean_exit_pass"]}
                                     for r, v in res.items()}}
                    running = []
                    history.append(entry)
                    improved = score > best_score or best_state is None
                    if improved:
                        best_score, best_step, bad_evals = score, step, 0
                        best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
                    else:
                        bad_evals += 1
                    log(f"[palbert] eval step {step}: dev {main} ({RULE_NAMES[select_rule]}) {score:.4f}, "
                        f"mean exit {res[select_rule]['mean_exit_pass']:.2f}/{mcfg.passes}; "
                        f"always-last {res['last']['main']:.4f}; best {best_score:.4f} @ {best_step}")
                    decision = bad_evals >= tcfg.early_stopping_patience
                stopped_early = bool(dist.broadcast(decision))
                if stopped_early and dist.main:
                    log(f"[palbert] early stopping at step {step} (no improvement in "
                        f"{tcfg.early_stopping_patience} evaluations)")
            if step >= total_steps or stopped_early:
                break
        epoch += 1
    train_seconds = time.time() - t_start

    if not dist.main:
        dist.barrier()
        return None

    # -- final evaluation with the best weights --------------------------------------------------
    model.load_state_dict(best_state)
    model.eval()
    t_eval = time.time()
    out = forward_all(model, dev_ids, dev_y, ecfg.batch_size, tok.pad_id)
    results_rules = evaluate_rules(model, out, dev_y, spec, rules, q=ecfg.q, patience=ecfg.patience,
                                   sample_draws=ecfg.sample_draws, seed=tcfg.seed)
    per_pass = [float(glue_metrics(spec.name, predictions_from_outputs(out.pass_logits[:, i],
                                                                       model.config.is_regression).numpy(),
                                   dev_y)[main]) for i in range(mcfg.passes)]
    p_mean = out.p.mean(0).tolist() if out.p is not None else None
    # The online path (examples leave the batch as they exit) must agree with the offline rule.
    batches = list(_batches(dev_ids, dev_y, 32, tok.pad_id))
    online_out, online_exit = _predict_all(model, batches, select_rule, ecfg.q, ecfg.patience)
    off_outputs, off_idx = offline_exit(out, select_rule, q=ecfg.q, patience=ecfg.patience,
                                        regression=model.config.is_regression,
                                        regression_threshold=model.config.pabee_regression_threshold)
    online = {
        "rule": select_rule, "batch_size": 32,
        "metrics": glue_metrics(spec.name, predictions_from_outputs(online_out, model.config.is_regression).numpy(),
                                dev_y),
        "mean_exit_pass": float(online_exit.float().mean()),
        "exit_agreement": float((online_exit == off_idx + 1).float().mean()),
        "max_abs_output_diff": float((online_out - off_outputs).abs().max()),
    }
    if select_rule == "sample":  # per-batch vs whole-set random draws: the streams differ by design
        online["exit_agreement"] = online["max_abs_output_diff"] = None
    timing = None
    if cfg.timing.enabled:
        t_rules = [r for r in cfg.timing.rules if r in rules]
        timing = time_rules(model, dev_ids[:cfg.timing.max_examples], tok.pad_id, rules=t_rules,
                            batch_sizes=cfg.timing.batch_sizes, repeats=cfg.timing.repeats, q=ecfg.q,
                            patience=ecfg.patience, threads=cfg.timing.threads)
    majority = None
    if not spec.is_regression:
        majority = majority_baseline(spec.name, train_full, dev)
    results = {
        "task": spec.name,
        "main_metric": main,
        "method": method,
        "num_passes": mcfg.passes,
        "core_mode": model.config.mode,
        "init": init,
        "seed": tcfg.seed,
        "select_rule": select_rule,
        "q": ecfg.q,
        "patience": ecfg.patience,
        "config": cfg.to_dict(),
        "data": {"dir": str(data_dir), "train_examples": len(train), "dev_examples": len(dev),
                 "tokenizer": tok.name},
        "majority_baseline": majority,
        "train": {"steps": step, "steps_per_epoch": steps_per_epoch, "best_step": best_step,
                  "best_dev_main": best_score, "stopped_early": stopped_early, "seconds": train_seconds,
                  "world_size": dist.world, "history": history},
        "dev": {"rules": results_rules, "per_pass": per_pass, "mean_p": p_mean},
        "online": online,
        "timing": timing,
        "eval_seconds": time.time() - t_eval,
        "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                        "machine": platform.machine()},
    }
    (output / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n", encoding="utf-8")
    (output / "results.md").write_text(results_markdown(results), encoding="utf-8")
    if tcfg.save_model:
        model.save_pretrained(output / "model")
    log(results_markdown(results))
    dist.barrier()
    return results


# ------------------------------------------------------------------------------------------------ report


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def results_markdown(results: dict[str, Any]) -> str:
    """The results table: metric per exit rule, mean exit pass, speed-up N / mean exit pass, and measured
    time per example (ms) at each timed batch size with the measured speed-up over always-last."""
    n = results["num_passes"]
    rules = results["dev"]["rules"]
    metric_names = list(next(iter(rules.values()))["metrics"])
    timing = results.get("timing") or {}
    batch_keys = [k for k in timing if k.startswith("batch_")]
    head = ["exit rule", *metric_names, "mean exit pass", f"speed-up (N={n} / mean)"]
    for bk in batch_keys:
        b = bk.split("_")[1]
        head += [f"ms/example @{b}", f"measured speed-up @{b}", f"ratio to ideal @{b}"]
    lines = [f"## {results['task']} — {results['method']} (N={n}, core {results['core_mode']}, "
             f"seed {results['seed']})",
             "",
             f"dev examples: {results['data']['dev_examples']}; train examples: {results['data']['train_examples']}; "
             f"best step {results['train']['best_step']} of {results['train']['steps']} "
             f"(selected on {results['main_metric']} with {RULE_NAMES[results['select_rule']]}); "
             f"q = {results['q']}, PABEE patience = {results['patience']}",
             "",
             "| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * len(head)) + "|"]
    for rule, st in rules.items():
        row = [RULE_NAMES[rule], *[_fmt(st["metrics"][k]) for k in metric_names], _fmt(st["mean_exit_pass"], 2),
               _fmt(st["speedup"], 2)]
        for bk in batch_keys:
            t = timing[bk].get(rule)
            row += ["—", "—", "—"] if t is None else [_fmt(1000 * t["sec_per_example"], 3),
                                                     _fmt(t["measured_speedup"], 2), _fmt(t["ratio_to_ideal"], 2)]
        lines.append("| " + " | ".join(row) + " |")
    per_pass = results["dev"].get("per_pass")
    if per_pass:
        lines += ["", f"{results['main_metric']} at each pass (no exit rule): "
                  + ", ".join(f"{i + 1}: {_fmt(v)}" for i, v in enumerate(per_pass))]
    if results["dev"].get("mean_p"):
        lines += ["mean exit distribution p (B4): " + ", ".join(f"{v:.3f}" for v in results["dev"]["mean_p"])]
    maj = results.get("majority_baseline")
    if maj:
        lines += ["", "majority class: " + ", ".join(f"{k} {_fmt(v)}" for k, v in maj.items())]
    on = results.get("online")
    if on and on["exit_agreement"] is not None:
        lines += [f"online {RULE_NAMES[on['rule']]} (examples leave the batch): {results['main_metric']} "
                  f"{_fmt(on['metrics'][results['main_metric']])}, exit agreement with offline "
                  f"{on['exit_agreement']:.4f}"]
    if timing:
        lines += [f"timing: {timing['examples']} dev examples, {timing['threads']} thread(s), each batch the "
                  f"best of {timing['repeats']} interleaved runs; speed-up measured against always-last"]
    return "\n".join(lines) + "\n"
