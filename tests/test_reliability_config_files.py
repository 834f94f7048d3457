"""Configuration files and ``--set`` values that are wrong fail clearly: a repeated key or section names its
line, bytes that are not UTF-8 name the file and position, an alias bomb anywhere (also inside
``deepspeed.overrides``) is refused at once, non-finite numbers name the key, and DeepSpeed batch sizes in
``deepspeed.overrides`` that contradict the train section name both values. Every config loader (training,
fine-tuning, study) reads YAML through the same strict reader."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from adaponder.cli import pretrain
from adaponder.palbert.config import load_finetune_config
from adaponder.strict_yaml import MAX_NODES, load_yaml
from adaponder.study.config import load_study_config
from adaponder.train.config import TrainConfigError, load_config, plan_run
from adaponder.train.ds_config import BatchSizes, build_ds_config
from adaponder.typed_config import ConfigError
from helpers_train import tiny_train_config, write_config


@pytest.fixture
def base(tmp_path) -> dict:
    return tiny_train_config(tmp_path / "data", tmp_path / "tok.json", tmp_path / "out")


def _bomb(depth: int = 9, width: int = 9) -> str:
    """Nested aliases that stand for width**depth nodes in a few hundred bytes."""
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    for i in range(1, depth):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines)


@pytest.fixture
def alarm():
    """Fail instead of hanging: the refusal must come before anything walks the expanded tree."""
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the alias bomb was not refused within 10 s"))
    signal.alarm(10)
    yield
    signal.alarm(0)


def _pretrain_error(argv: list[str], capsys) -> str:
    code = pretrain.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_duplicate_key_and_duplicate_section_name_their_lines(tmp_path, capsys):
    dup_key = tmp_path / "dup_key.yaml"
    dup_key.write_text("optim:\n  lr: 0.001\n  warmup: 2\n  lr: 0.1\n")
    with pytest.raises(TrainConfigError, match=r"line 4: duplicate key 'lr' \(first given on line 2\)") as err:
        load_config(dup_key)
    assert str(dup_key) in str(err.value)
    dup_section = tmp_path / "dup_section.yaml"
    dup_section.write_text("optim:\n  lr: 0.001\ntrain:\n  steps: 4\noptim:\n  warmup: 2\n")
    err = _pretrain_error(["--config", str(dup_section)], capsys)
    assert f"{dup_section}: line 5: duplicate key 'optim' (first given on line 1)" in err
    # The other loaders read through the same reader.
    for load in (load_finetune_config, load_study_config):
        with pytest.raises(ConfigError, match="line 5: duplicate key 'optim'"):
            load(dup_section)


def test_merge_keys_still_override_what_they_merge():
    assert load_yaml("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  x: 3\n") == {"a": {"x": 1, "y": 2}, "b": {"x": 3, "y": 2}}


def test_non_utf8_config_names_the_file_line_and_byte(tmp_path, capsys):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("train:\n  steps: 4\n# café\n".encode("latin-1"))
    err = _pretrain_error(["--config", str(bad)], capsys)
    assert f"{bad}: line 3 (byte 23): byte 0xe9 is not valid UTF-8" in err


def test_alias_bomb_inside_deepspeed_overrides_is_refused_quickly(tmp_path, base, alarm, capsys):
    bomb = "\n".join("    " + ln for ln in _bomb().splitlines())
    path = tmp_path / "bomb.yaml"
    write_config(path, base)
    path.write_text(path.read_text().replace("deepspeed:\n", f"deepspeed:\n  overrides:\n{bomb}\n", 1))
    err = _pretrain_error(["--config", str(path)], capsys)
    assert f"{path}: its aliases expand to" in err and f"more than the {MAX_NODES:,}" in err
    with pytest.raises(TrainConfigError, match="--set 'deepspeed.overrides=.*aliases expand to"):
        load_config(None, ["deepspeed.overrides={" + _bomb().replace("\n", ", ") + "}"])


def test_recursive_alias_is_refused():
    with pytest.raises(ValueError, match="line 1: an alias refers to a value that contains it"):
        load_yaml("a: &a [*a]")


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", ".inf"])
def test_non_finite_numbers_name_the_key(value, tmp_path, base, capsys):
    path = write_config(tmp_path / "run.yaml", base)
    err = _pretrain_error(["--config", str(path), "--set", f"optim.lr={value}"], capsys)
    assert "optim.lr: must be a finite number, got" in err and value.lstrip(".") in err
    base["schedule"]["s0"] = float("nan")  # a YAML .nan in a step-or-fraction key
    base["model"]["initializer_range"] = float("inf")  # and in the model section
    with pytest.raises(TrainConfigError) as info:
        load_config(write_config(tmp_path / "nan.yaml", base))
    assert "schedule.s0: must be an integer or a finite number, got nan" in str(info.value)
    assert "'initializer_range' must be a finite number, got inf" in str(info.value)


@pytest.mark.parametrize("key, value, expected", [
    ("train_batch_size", 64, "train_batch_size: 64 disagrees with the run's global batch (8,"),
    ("train_micro_batch_size_per_gpu", 2, "train_micro_batch_size_per_gpu: 2 disagrees with the run's "
                                          "micro-batch per rank (4,"),
    ("gradient_accumulation_steps", 3, "gradient_accumulation_steps: 3 disagrees with the run's gradient "
                                       "accumulation steps (2,"),
])
def test_deepspeed_batch_overrides_that_contradict_the_train_section_name_both(key, value, expected, tmp_path, base):
    base["deepspeed"]["overrides"] = {key: value}
    cfg = load_config(write_config(tmp_path / "run.yaml", base))
    with pytest.raises(TrainConfigError, match="deepspeed.overrides." + expected.replace("(", r"\(")):
        plan_run(cfg, 1)
    agreeing = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    base["deepspeed"]["overrides"] = agreeing
    cfg = load_config(write_config(tmp_path / "ok.yaml", base))
    assert build_ds_config(cfg.deepspeed, BatchSizes.of(plan_run(cfg, 1)), cfg.optim.grad_clip)["train_batch_size"] == 8


def test_a_plain_config_still_loads(tmp_path, base):
    cfg = load_config(write_config(tmp_path / "run.yaml", base))
    assert cfg.optim.lr == pytest.approx(3e-3) and Path(cfg.data.path).name == "data"
