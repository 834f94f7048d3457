"""Capacity plan of a training run: memory per rank, FLOPs per token, step time, days to the token budget.

    python launch/plan.py --config configs/pythia410m.yaml --gpus 8 --gpu h100-80gb
    python launch/plan.py --config configs/pythia1b.yaml --gpus 64 --gpu-mem-gb 94 --gpu-tflops 989 --mfu 0.35
    python launch/plan.py --config configs/pythia410m.yaml --gpus 8 --set deepspeed.zero_stage=2 train.micro_batch=8

Memory per rank (bytes; Ψ parameters, N data-parallel ranks, w = 2 for bf16/fp16 and 4 for fp32 weights):

* **model states**, as DeepSpeed lays them out for the run's ZeRO stage and precision. Weights wΨ (ZeRO-3:
  wΨ/N, plus the working set it gathers); gradients wΨ (ZeRO-2/3: wΨ/N plus the reduce buckets; bf16 with
  ZeRO-1 is DeepSpeed's BF16 optimizer, which also keeps a full fp32 accumulation buffer of 4Ψ because the
  trainer asks for fp32 gradient accumulation); AdamW 12Ψ/N (fp32 master copy, m, v; ZeRO-0: not
  partitioned, and fp32 without ZeRO has no master copy). ``offload_optimizer`` moves master, m and v (and the
  fp32 gradient partition) to host memory, reported separately.
* **activations**: what autograd keeps for backward, counted per backbone position from what the pass loop
  (``adaponder/modeling``) and transformers' GPT-NeoX layer save with SDPA/flash attention, in the activation
  dtype a: per layer 10d + 2f in the first pass (the fused QKV output stays alive as V's storage) and 8d + 2f
  in later passes (V and K are the A3-aligned copies); per pass the final-norm input, and before every later
  pass the final-norm output, the pondering embedding (A4) and the gate MLP's two hidden activations (A5);
  fp32 norm statistics and attention log-sum-exp. The chunked loss (A10) keeps its gradients from the forward:
  T·d·a + V·d·4. With per-pass activation checkpointing (``deepspeed.activation_checkpointing``) a pass keeps
  only its input and the aligned K/V of every layer (which the next pass reads, A3), and backward recomputes
  one pass at a time.
* **workspace**: the [rows, V] probability blocks of the pondering embedding and loss (at most 2²⁵ entries
  each, fp32, plus a w-byte copy below fp32) and the gradients of one layer in flight during backward.

Activations and gradients do not peak together (backward frees one as it fills the other), so the peak is
``persistent states + max(activations + workspace, gradients + optimizer-step temporaries)``. Not modelled:
the CUDA context and NCCL buffers (``--reserve-gb``, default 3 GiB, is held back for them and for allocator
fragmentation), eager attention's T×T weights. The model is checked against measured peaks on the CPU for three
small shapes (``tests/test_plan.py``); the GPU layout of DeepSpeed's bf16 states follows its source, untested here.

FLOPs per token are the model's own accounting (``AdaPonderForCausalLM.flops_per_token``, A17), at K passes for
every token (halting lowers it); step time = tokens per step × training FLOPs per token / (ranks × peak × MFU),
with MFU counting model FLOPs as the trainer logs it. Per-pass checkpointing recomputes one backbone forward:
its step time is scaled by (training FLOPs + backbone forward) / training FLOPs at the same hardware use.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM, pythia_config

from adaponder.modeling.run_settings import RunSettings

from .config import TrainConfig, TrainConfigError, backbone_shape, plan_run
from .peak import cuda_peak

GiB = 1024**3
#: Share of the usable memory a shipped preset leaves free, and that the advice keeps free: the model misses
#: allocator fragmentation and a ±15% error against measured peaks is accepted (``tests/test_plan.py``).
HEADROOM = 0.10
#: Rows × V entries of one pondering/loss block on the CPU and on a GPU (``adaponder.modeling.pondering``).
BLOCK_ENTRIES = 1 << 25
CUDA_BLOCK_ENTRIES = 1 << 27


@dataclass(frozen=True)
class Device:
    """An accelerator: usable memory (GiB, as ``nvidia-smi`` reports it) and the name its dense peak FLOP/s are
    looked up under in :data:`adaponder.train.peak.CUDA_PEAKS`."""

    label: str
    memory_gib: float
    peak_key: str

    def peak_flops(self, precision: str) -> float | None:
        return cuda_peak(self.peak_key, precision)


DEVICES: dict[str, Device] = {
    "h100-80gb": Device("NVIDIA H100 SXM 80GB", 81559 / 1024, "H100"),
    "h100-pcie": Device("NVIDIA H100 PCIe 80GB", 81559 / 1024, "H100 PCIe"),
    "h200": Device("NVIDIA H200 141GB", 143771 / 1024, "H200"),
    "a100-80gb": Device("NVIDIA A100 80GB", 80.0, "A100"),
    "a100-40gb": Device("NVIDIA A100 40GB", 40.0, "A100"),
    "l40s": Device("NVIDIA L40S 48GB", 46068 / 1024, "L40S"),
    "l4": Device("NVIDIA L4 24GB", 23034 / 1024, "L4"),
}


# -- the model's shape --------------------------------------------------------------------------------------
def model_config_of(cfg: TrainConfig):
    """The :class:`AdaPonderConfig` the run trains. With ``init.backbone`` the shape comes from the checkpoint:
    its ``config.json`` for a local folder, the Pythia preset named in a hub id (``EleutherAI/pythia-410m-deduped``)."""
    if cfg.init.backbone is None:
        return cfg.model_config()
    mode, overrides = cfg.model_overrides()
    shape = backbone_shape(cfg.init.backbone)
    if shape is not None:
        return AdaPonderConfig(**shape, mode=mode, **overrides)
    match = re.search(r"pythia-(\d+(?:\.\d+)?[mb])", str(cfg.init.backbone).lower())
    if match is None:
        raise TrainConfigError([f"init.backbone: {cfg.init.backbone} is neither a local checkpoint folder nor a "
                                "Pythia hub id; the planner needs its shape (give a local folder)"], cfg.source)
    return pythia_config(match.group(1), mode, **overrides)


def _meta_model(model_cfg):
    with torch.device("meta"):
        return AdaPonderForCausalLM(model_cfg)


# -- memory ---------------------------------------------------------------------------------------------------
@dataclass
class Memory:
    """Bytes per rank. ``params``, ``grads``, ``optimizer``, ``buffers``: model states; ``activations``: kept for
    backward (peak of the pass loop); ``workspace``: transient blocks; ``step_temps``: the optimizer step's own
    temporaries; ``peak``: the modelled high-water mark; ``host``: offloaded states (host memory)."""

    params: float
    grads: float
    optimizer: float
    buffers: float
    activations: float
    workspace: float
    step_temps: float
    peak: float
    host: float = 0.0


def _dtype_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def activation_bytes(mc, micro_batch: int, seq_len: int, precision: str, checkpointing: bool,
                     settings: RunSettings | None = None) -> float:
    """Bytes autograd keeps at the end of one training forward (see the module doc), plus the loss gradients;
    ``settings``: the training forward's (whether pondering probabilities are recomputed)."""
    settings = settings or RunSettings()
    a = _dtype_bytes(precision)
    d, f, L, K, h, V = (mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers, mc.num_passes,
                        mc.num_attention_heads, mc.vocab_size)
    tokens = micro_batch * seq_len
    positions = tokens * (mc.num_pauses + 1)  # A19: a token and its pauses occupy P+1 backbone positions
    serial = 0 if mc.use_parallel_residual else d  # the second norm's input is a tensor of its own
    small = (4 + h) * 4  # fp32: mean and rstd of two layer norms, attention log-sum-exp per head
    first = (10 * d + 2 * f + serial) * a + small
    later = (8 * d + 2 * f + serial) * a + small
    between = 0.0  # per position, before each of passes 2..K
    if mc.ponders:
        between = 2 * d * a  # final-norm output (read by head, gate and pondering) + pondering embedding e
        if mc.gated:
            between += 2 * mc.gate_hidden_mult * d * a + 4 + 4 + a  # gate MLP activations, s, m·s
        if not settings.recompute:
            between += V * 4  # probabilities kept for backward
    per_pass = d * a + 2 * 4  # final layer norm input + statistics
    if mc.mode == "loop":  # ... which is the next pass's input there, already counted with the layers
        per_pass -= d * a * (K - 1) / K
    if checkpointing:
        # Kept: each pass's input and the aligned K/V of every layer of every pass (pass 1: K plus the fused QKV
        # storage its V lives in). Backward recomputes one pass at a time: a later pass's layers plus the
        # gradients of the previous pass's K/V weigh as much as the first pass's layers.
        kept = K * d * a + L * (4 * d + 2 * d * (K - 1)) * a
        layers = kept + L * first
    else:
        layers = L * (first + (K - 1) * later)
    per_position = layers + K * per_pass + (K - 1) * between
    loss = tokens * d * a + V * d * 4  # gradients formed in the forward (A10)
    return positions * per_position + loss


def workspace_bytes(mc, micro_batch: int, seq_len: int, precision: str, settings: RunSettings | None = None,
                    block_entries: int = BLOCK_ENTRIES) -> float:
    """The pondering/loss probability blocks and one layer's gradients in flight during backward
    (``block_entries``: the device's default block, when ``settings.chunk_size`` is 0)."""
    settings = settings or RunSettings()
    a = _dtype_bytes(precision)
    d, f, V = mc.hidden_size, mc.intermediate_size, mc.vocab_size
    rows = micro_batch * seq_len
    cap = settings.chunk_size or max(1, block_entries // V)
    block = min(rows, cap) * V * (4 + (a if a != 4 else 0))
    positions = rows * (mc.num_pauses + 1)
    in_flight = positions * (f + 3 * d) * a  # one f-wide and three d-wide gradients of the layer in backward
    return (2 if mc.ponders else 1) * block + in_flight  # the pondering backward's block of its own


def state_bytes(n_params: float, zero_stage: int, precision: str, world: int, offload: bool = False,
                bucket: float | None = None, gathered: float = 0.0) -> dict[str, float]:
    """Model states per rank (see the module doc): params, grads (at their peak), optimizer, buffers, the
    optimizer step's temporaries, and what is persistent (present during the forward too)."""
    P, N, w = float(n_params), max(1, world), _dtype_bytes(precision)
    bucket = float(bucket if bucket is not None else min(5e8, P))
    params = w * P / (N if zero_stage == 3 else 1)
    master = 4 * P if precision != "fp32" or zero_stage >= 1 else 0.0
    optimizer = (master + 8 * P) / (N if zero_stage >= 1 else 1)
    buffers = 0.0
    persistent_grads = 0.0
    if zero_stage >= 2:
        grads = w * P / N
        buffers = 2 * bucket * w  # the reduce buckets (two with overlap_comm)
        persistent_grads = grads
    elif zero_stage == 1 and precision == "bf16":
        persistent_grads = 4 * P  # BF16 optimizer: fp32 accumulation buffer, full size
        grads = persistent_grads + 2 * P  # + the bf16 .grad of each parameter until it is accumulated
    else:
        grads = w * P
    if zero_stage == 3:
        buffers += gathered
    # Step: ZeRO 1/2 copy the gradients into a flat fp32 partition (the BF16 optimizer's is a view of its
    # buffer); AdamW then holds sqrt(v) and sqrt(v)/c at once, two partitions (the optimizer guard's finiteness
    # check before it needs 1.5).
    part = 4 * P / (N if zero_stage >= 1 else 1)
    bf16_optimizer = zero_stage == 1 and precision == "bf16"
    step_temps = (part if zero_stage in (1, 2) and not bf16_optimizer else 0.0) + 2 * part
    host = 0.0
    if offload:
        host, optimizer, step_temps = optimizer + part, 0.0, 0.0
    return {"params": params, "grads": grads, "persistent_grads": persistent_grads, "optimizer": optimizer,
            "buffers": buffers, "step_temps": step_temps, "host": host}


def memory(mc, n_params: int, *, micro_batch: int, seq_len: int, zero_stage: int, precision: str, world: int,
           checkpointing: bool, offload: bool = False, settings: RunSettings | None = None,
           block_entries: int = BLOCK_ENTRIES) -> Memory:
    """The per-rank memory of one configuration (bytes); ``block_entries``: the pondering block of the device it
    runs on (:data:`CUDA_BLOCK_ENTRIES` for a GPU)."""
    w = _dtype_bytes(precision)
    bucket = min(5e8, math.ceil(n_params / 2**20) * 2**20)  # as build_ds_config sizes DeepSpeed's buckets
    gathered = 0.0
    if zero_stage == 3:  # embedding and head stay gathered for the forward (external parameters), + prefetch
        d, V = mc.hidden_size, mc.vocab_size
        layer = 4 * d * d + 2 * d * mc.intermediate_size
        gathered = (2 * V * d + bucket / 10 + 2 * layer) * w
    s = state_bytes(n_params, zero_stage, precision, world, offload, bucket, gathered)
    acts = activation_bytes(mc, micro_batch, seq_len, precision, checkpointing, settings)
    ws = workspace_bytes(mc, micro_batch, seq_len, precision, settings, block_entries)
    persistent = s["params"] + s["optimizer"] + s["buffers"] + s["persistent_grads"]
    transient_grads = s["grads"] - s["persistent_grads"]
    peak = persistent + max(acts + ws, transient_grads + s["step_temps"])
    return Memory(params=s["params"], grads=s["grads"], optimizer=s["optimizer"], buffers=s["buffers"],
                  activations=acts, workspace=ws, step_temps=s["step_temps"], peak=peak, host=s["host"])


# -- the plan -------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    config: str
    device: str
    gpus: int
    precision: str
    zero_stage: int
    micro_batch: int
    grad_accum: int
    global_batch: int
    seq_len: int
    passes: int
    mode: str
    params: dict[str, int]
    flops_per_token: dict[str, float]  # training (×3), K passes for every token
    budget_tokens: float
    total_steps: int
    peak_flops: float | None
    mfu: float
    usable_bytes: float
    memory: dict[str, Memory]  # "no checkpointing" / "per-pass checkpointing"
    max_micro_batch: dict[str, int]
    max_dividing: dict[str, int]  # the largest that fits and divides the global batch over the ranks
    step_seconds: dict[str, float | None]
    config_checkpointing: bool = False
    #: ``--set`` overrides that make the run fit with :data:`HEADROOM` at the same global batch (empty: it does
    #: already); ``advice_note``: what they give, or why nothing does.
    advice: list[str] = dataclasses.field(default_factory=list)
    advice_note: str = ""

    @property
    def config_variant(self) -> str:
        return "per-pass checkpointing" if self.config_checkpointing else "no checkpointing"

    @property
    def headroom(self) -> float:
        """Share of the usable memory the config's own setting leaves free (negative: it does not fit)."""
        return 1 - self.memory[self.config_variant].peak / self.usable_bytes

    def days(self, variant: str) -> float | None:
        t = self.step_seconds[variant]
        return None if t is None else t * self.total_steps / 86400


def largest_micro_batch(fits, limit: int = 4096) -> int:
    """The largest b ≤ ``limit`` with ``fits(b)`` (memory grows with b), 0 if none."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def fit_advice(cfg: TrainConfig, per_rank: int, estimate, usable: float) -> tuple[list[str], str]:
    """``--set`` overrides that fit the run in ``(1 - HEADROOM) × usable`` bytes at the same global batch: the
    largest micro-batch dividing the ``per_rank`` sequences each rank takes per step, in the config's checkpointing
    setting, else with per-pass checkpointing on. ``estimate(b, checkpointing)`` is the :class:`Memory` of
    micro-batch b. Returns ([], note) when the config fits already or nothing does."""
    limit = (1 - HEADROOM) * usable
    ckpt_now = cfg.deepspeed.activation_checkpointing
    if estimate(cfg.train.micro_batch, ckpt_now).peak <= limit:
        return [], ""
    for ckpt in dict.fromkeys((ckpt_now, True)):
        best = largest_micro_batch(lambda b, c=ckpt: estimate(b, c).peak <= limit, limit=per_rank)
        b = max((b for b in range(1, best + 1) if per_rank % b == 0), default=0)
        if b == 0:
            continue
        sets = [f"train.micro_batch={b}"]
        if cfg.train.grad_accum is not None:  # (with only global_batch given, accumulation follows by itself)
            sets.append(f"train.grad_accum={per_rank // b}")
        if ckpt != ckpt_now:
            sets.append("deepspeed.activation_checkpointing=true")
        peak = estimate(b, ckpt).peak
        return sets, (f"accumulation {per_rank // b}, the same global batch; peak {peak / GiB:.1f} GiB, "
                      f"{1 - peak / usable:.0%} headroom")
    return [], (f"not even micro-batch 1 with per-pass checkpointing leaves {HEADROOM:.0%} headroom: use more "
                "GPUs, a higher deepspeed.zero_stage or deepspeed.offload_optimizer")


def make_plan(cfg: TrainConfig, gpus: int, device: Device, *, mfu: float = 0.4, memory_gib: float | None = None,
              peak_flops: float | None = None, reserve_gib: float = 3.0, model_cfg=None) -> Plan:
    """The plan of ``cfg`` on ``gpus`` × ``device``; ``model_cfg``: the model's configuration when it is known
    already (a built model's), else it follows from ``cfg`` (:func:`model_config_of`)."""
    mc = model_cfg if model_cfg is not None else model_config_of(cfg)
    model = _meta_model(mc)
    counts = model.parameter_counts()
    n = counts["total"]
    rp = plan_run(cfg, gpus)
    ds = cfg.deepspeed
    prec = ds.precision
    flops = model.flops_per_token(None, context=rp.seq_len, training=True)
    usable = ((memory_gib if memory_gib is not None else device.memory_gib) - reserve_gib) * GiB
    peak = peak_flops if peak_flops is not None else device.peak_flops(prec)
    variants = {"no checkpointing": False, "per-pass checkpointing": True}
    mem, biggest, dividing, step = {}, {}, {}, {}
    per_rank = rp.global_batch // gpus  # sequences each rank processes per step (micro-batch × accumulation)

    def estimate(b, ckpt):
        return memory(mc, n, micro_batch=b, seq_len=rp.seq_len, zero_stage=ds.zero_stage, precision=prec,
                      world=gpus, checkpointing=ckpt, offload=ds.offload_optimizer != "none",
                      settings=cfg.run_settings(), block_entries=CUDA_BLOCK_ENTRIES)

    fwd_backbone = flops["backbone"] / 3  # recomputed once per step under per-pass checkpointing
    for name, ckpt in variants.items():
        mem[name] = estimate(rp.micro_batch, ckpt)
        biggest[name] = largest_micro_batch(lambda b, c=ckpt: estimate(b, c).peak <= usable)
        dividing[name] = max((b for b in range(1, biggest[name] + 1) if per_rank % b == 0), default=0)
        work = flops["total"] + (fwd_backbone if ckpt else 0.0)
        step[name] = rp.tokens_per_step * work / (gpus * peak * mfu) if peak else None
    advice, note = fit_advice(cfg, per_rank, estimate, usable)
    return Plan(config=cfg.source or "", device=device.label, gpus=gpus, precision=prec, zero_stage=ds.zero_stage,
                micro_batch=rp.micro_batch, grad_accum=rp.grad_accum, global_batch=rp.global_batch,
                seq_len=rp.seq_len, passes=mc.num_passes, mode=mc.mode, params=counts, flops_per_token=flops,
                budget_tokens=float(rp.total_steps * rp.tokens_per_step), total_steps=rp.total_steps,
                peak_flops=peak, mfu=mfu, usable_bytes=usable, memory=mem, max_micro_batch=biggest,
                max_dividing=dividing, step_seconds=step, config_checkpointing=ds.activation_checkpointing,
                advice=advice, advice_note=note)


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def format_plan(p: Plan) -> str:
    """Markdown: the run, FLOPs by part, memory by part for both checkpointing settings, time."""
    pc = p.params
    lines = [f"**{p.config}** on {p.gpus} × {p.device}: {p.mode}, K = {p.passes}, {p.precision}, ZeRO-{p.zero_stage}, "
             f"micro-batch {p.micro_batch} × accumulation {p.grad_accum} × {p.gpus} ranks = {p.global_batch} "
             f"sequences of {p.seq_len} tokens",
             "",
             f"Parameters: {pc['total'] / 1e6:,.1f} M (embedding + head {pc['embedding'] / 1e6:,.1f} M, layers "
             f"{pc['non_embedding'] / 1e6:,.1f} M, gates {pc['gates'] / 1e6:,.1f} M)",
             ""]
    f = p.flops_per_token
    tot = f["total"]
    lines += ["| training FLOPs per token (A17, ×3, K passes) | backbone | head | pondering | gates | total |",
              "|---|---:|---:|---:|---:|---:|",
              "| GFLOP | " + " | ".join(f"{f[k] / 1e9:.2f}" for k in ("backbone", "head", "pondering", "gates"))
              + f" | {tot / 1e9:.2f} |",
              "| share | " + " | ".join(f"{f[k] / tot:.1%}" for k in ("backbone", "head", "pondering", "gates"))
              + " | 100% |", ""]
    names = list(p.memory)
    heads = [n + (" (the config's)" if (n == "per-pass checkpointing") == p.config_checkpointing else "")
             for n in names]
    lines += [f"| memory per rank (GiB), micro-batch {p.micro_batch} | " + " | ".join(heads) + " |",
              "|---|" + "---:|" * len(names)]
    rows = [("weights", "params"), ("gradients", "grads"), ("optimizer (master, m, v)", "optimizer"),
            ("DeepSpeed buffers", "buffers"), ("activations", "activations"), ("workspace", "workspace"),
            ("optimizer-step temporaries", "step_temps")]
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(_gib(getattr(p.memory[n], key)) for n in names) + " |")
    if any(p.memory[n].host for n in names):
        lines.append("| host (offloaded optimizer) | " + " | ".join(_gib(p.memory[n].host) for n in names) + " |")
    lines.append("| **peak** | " + " | ".join(f"**{_gib(p.memory[n].peak)}**" for n in names) + " |")
    lines.append(f"| fits in {_gib(p.usable_bytes)} GiB usable | "
                 + " | ".join("yes" if p.memory[n].peak <= p.usable_bytes else "**no**" for n in names) + " |")
    lines.append("| largest micro-batch that fits | " + " | ".join(str(p.max_micro_batch[n]) for n in names) + " |")
    lines.append(f"| … that divides {p.global_batch} / {p.gpus} ranks | "
                 + " | ".join(str(p.max_dividing[n]) for n in names) + " |")
    lines += ["", *verdict_lines(p), ""]
    if p.peak_flops:
        lines += [f"Time at {p.mfu:.0%} MFU of {p.peak_flops / 1e12:,.0f} TFLOP/s per GPU, "
                  f"{p.budget_tokens / 1e9:,.1f} B tokens ({p.total_steps:,} steps of "
                  f"{p.global_batch * p.seq_len:,} tokens):", ""]
        lines += ["| | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(names)]
        lines.append("| step | " + " | ".join(f"{p.step_seconds[n]:.2f} s" for n in names) + " |")
        lines.append("| days to the token budget | " + " | ".join(f"{p.days(n):.1f}" for n in names) + " |")
    else:
        lines.append("Time: no peak FLOP/s known for this device and precision (give --gpu-tflops).")
    return "\n".join(lines)


def verdict_lines(p: Plan) -> list[str]:
    """Whether the config's own setting fits (with the headroom the presets keep), and if not, what to set."""
    peak = p.memory[p.config_variant].peak
    what = f"peak {_gib(peak)} GiB of {_gib(p.usable_bytes)} GiB usable"
    if peak > p.usable_bytes:
        lines = [f"fits: no ({what})"]
    elif p.headroom < HEADROOM:
        lines = [f"fits: barely ({what}: {p.headroom:.0%} headroom, under the {HEADROOM:.0%} the presets keep)"]
    else:
        return [f"fits: yes ({what}: {p.headroom:.0%} headroom)"]
    if p.advice:
        lines.append(f"to fit: {advice_args(p.advice)}   ({p.advice_note})")
    else:
        lines.append(f"to fit: {p.advice_note}")
    return lines


def advice_args(sets: list[str]) -> str:
    """``--set a=1 --set b=2``: accepted by launch/pretrain.py and launch/plan.py alike."""
    return " ".join(f"--set {s}" for s in sets)


def startup_memory_warning(cfg: TrainConfig, device, world_size: int, model_cfg=None, *,
                           total_memory: int | None = None, name: str | None = None,
                           reserve_gib: float = 3.0) -> str | None:
    """The trainer's check before its first step: one warning line when, by the planner's model, the run will not
    fit the memory of ``device`` (a :class:`torch.device`); ``None`` when it fits or the device is no CUDA GPU
    (a CPU's memory is the host's, which the model does not describe). ``total_memory`` (bytes) and ``name``
    default to what CUDA reports for the device."""
    if getattr(device, "type", device) != "cuda":
        return None
    if total_memory is None or name is None:
        props = torch.cuda.get_device_properties(device)
        total_memory = props.total_memory if total_memory is None else total_memory
        name = props.name if name is None else name
    # A copy: building the meta model must not touch the configuration of the model being trained.
    model_cfg = copy.deepcopy(model_cfg) if model_cfg is not None else None
    gib = total_memory / GiB
    p = make_plan(cfg, world_size, Device(name, gib, name), memory_gib=gib, reserve_gib=reserve_gib,
                  model_cfg=model_cfg)
    if p.headroom >= 0:
        return None
    verdict, *advice = verdict_lines(p)
    return (f"warning: this run will not fit {name} ({gib:.1f} GiB, {reserve_gib:g} GiB held back) by the "
            f"planner's model, expect CUDA out of memory: {verdict.removeprefix('fits: no ')}; "
            + " ".join(advice))


def plan_dict(p: Plan) -> dict[str, Any]:
    out = dataclasses.asdict(p)
    out["days"] = {n: p.days(n) for n in p.memory}
    out["headroom"] = p.headroom
    return out


__all__ = ["DEVICES", "Device", "Memory", "Plan", "activation_bytes", "workspace_bytes", "state_bytes", "memory",
           "make_plan", "format_plan", "largest_micro_batch", "model_config_of", "HEADROOM", "fit_advice",
           "verdict_lines", "advice_args", "startup_memory_warning"]


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-plan` (or `python -m adaponder.cli.plan`)")
