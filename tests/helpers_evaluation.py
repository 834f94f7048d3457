"""Shared helpers of the evaluation tests (not a test module): a tiny saved AdaPonder checkpoint with the
Pythia tokenizer.

The checkpoint is built once per test session (cached here, the module is shared by every test file that
imports it) and lives under pytest's session temporary folder.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from adaponder.modeling.run_settings import DEFAULT_TAU
from conftest import SHARED_DATA

TOKENIZER_FILE = SHARED_DATA / "tokenizers" / "gpt-neox-20b" / "tokenizer.json"
WIKITEXT = SHARED_DATA / "corpus" / "wikitext-2" / "wiki.test.tokens"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
_CACHE: dict[str, Path] = {}


def tiny_tokenizer():
    from transformers import PreTrainedTokenizerFast

    if not TOKENIZER_FILE.is_file():
        pytest.skip(f"tokenizer not found at {TOKENIZER_FILE}")
    return PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_FILE), eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", pad_token="<|padding|>")


def tiny_model(**overrides):
    from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM

    # Gates start at s ≈ DEFAULT_TAU, so that at the τ every evaluation runs with unless told otherwise some tokens
    # halt after each pass and some go on (τ is a setting of each call, not saved with the checkpoint).
    values = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  vocab_size=50304, mode="adaponder", gate_init_bias=math.log(DEFAULT_TAU / (1 - DEFAULT_TAU)))
    values.update(overrides)
    torch.manual_seed(0)
    return AdaPonderForCausalLM(AdaPonderConfig(**values)).eval()


def tiny_checkpoint(tmp_path_factory) -> Path:
    """A saved tiny AdaPonder checkpoint + tokenizer (the brief's test shape), built once per session."""
    if "ckpt" not in _CACHE:
        path = tmp_path_factory.mktemp("adaponder_eval") / "tiny-ckpt"
        tok = tiny_tokenizer()
        tiny_model().save_pretrained(path)
        tok.save_pretrained(path)
        _CACHE["ckpt"] = path
    return _CACHE["ckpt"]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    return env


def lm_eval_logging_restored():
    """A generator for a pytest fixture around a test that runs lm-eval in-process. lm-eval's ``setup_logging``
    adds, once per process, a handler bound to the ``sys.stderr`` of that moment, which in a test is pytest's capture
    of that test, closed after it: a later test's lm-eval warning would print a logging error with a traceback. The
    handlers added meanwhile are removed and the once-flag restored, so the next run binds to its own stderr."""
    import logging

    try:
        import lm_eval.utils as lm_utils
    except ImportError:
        yield
        return
    logger = logging.getLogger("lm_eval")
    handlers, configured = list(logger.handlers), getattr(lm_utils, "_LOGGING_CONFIGURED", False)
    yield
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)
    lm_utils._LOGGING_CONFIGURED = configured


def ctrl_c_while_calibrating(cmd: list[str], cwd, env: dict, timeout: float = 300) -> tuple[int, str, str, list[str]]:
    """Run ``adaponder calibrate`` (``cmd``); once it says it is calibrating (its progress shows, before any result),
    press Ctrl-C (SIGINT). Returns its exit code, stdout, stderr and the stderr lines that mention Ctrl-C."""
    import signal
    import subprocess
    import threading
    import time

    # Ctrl-C's default action in the child, as from a terminal: a suite started in the background (SIGINT ignored,
    # as a non-interactive shell does for `cmd &`) would pass the ignore on, and Python then never raises
    # KeyboardInterrupt
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True)
    reader.start()
    deadline = time.time() + timeout
    while "calibrating" not in "".join(err) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    # frozen at once, so a small model cannot finish (and start writing) before the signal lands mid-calibration
    proc.send_signal(signal.SIGSTOP)
    try:
        assert proc.poll() is None, "".join(err)[-3000:]  # still calibrating: the bar showed before any result
        proc.send_signal(signal.SIGINT)
    finally:
        proc.send_signal(signal.SIGCONT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    text = "".join(err)
    return proc.returncode, proc.stdout.read(), text, [
        ln.strip() for ln in text.replace("\r", "\n").splitlines() if "Ctrl-C" in ln]

