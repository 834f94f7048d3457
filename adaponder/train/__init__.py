"""Pretraining AdaPonderLM and its baselines with DeepSpeed: config, schedules, checkpoints, metrics, loop.

Entry point: ``deepspeed launch/pretrain.py --config configs/pythia410m.yaml`` (or plain ``python`` for one
process). Modules: :mod:`.config` (typed YAML config), :mod:`.schedule` (lr, A13, A14), :mod:`.ds_config`
(generated DeepSpeed config), :mod:`.optim` (guarded AdamW), :mod:`.checkpoint` (crash-safe checkpoints),
:mod:`.metrics` (logging), :mod:`.report` (validation report), :mod:`.export` (Hugging Face export),
:mod:`.distributed` (process group, engine), :mod:`.stopping` (signals, exit codes), :mod:`.resume_checks`
(what a resume may change), :mod:`.harness` (the run skeleton shared with fine-tuning: set-up, resume, step
loop, checkpoints, stops, shutdown), :mod:`.pretraining_inputs` (data and model of a run), :mod:`.trainer`
(pretraining's step, validation and report).
"""

from .config import TrainConfig, TrainConfigError, load_config, plan_run
from .schedule import learning_rate, ponder_schedule

__all__ = ["TrainConfig", "TrainConfigError", "load_config", "plan_run", "learning_rate", "ponder_schedule"]
