"""The configuration tree is typed all the way down: the ``model`` section, the ``data`` section the data functions
take, the sections fine-tuning shares with pretraining, one DeepSpeed problem check, one error class; and the two
training loaders follow one protocol."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from adaponder.data.config import DataConfig
from adaponder.data.cursor import TokenLoader
from adaponder.data.training_source import DataSource, training_source, validation_source
from adaponder.palbert.config import CheckpointSection, FinetuneConfigError, LoggingSection, load_finetune_config
from adaponder.train.config import (CheckpointConfig, CheckpointSettings, LoggingConfig, LoggingSettings,
                                    ModelSection, TrainConfigError, config_from_dict)
from adaponder.typed_config import ConfigError

RUN = {"data": {"path": "data/x", "seq_len": 32}, "train": {"steps": 2, "grad_accum": 1}}


def _train(model, **sections):
    return config_from_dict({**RUN, "model": model, **sections}, "run.yaml")


def test_the_model_section_is_typed_and_written_back_as_the_user_wrote_it():
    written = {"size": "tiny", "passes": 3, "mode": "ponderlm", "gate_init_bias": None}
    cfg = _train(written)
    assert isinstance(cfg.model, ModelSection)
    assert (cfg.model.size, cfg.model.mode, cfg.model.recurrence) == ("tiny", "ponderlm", "ponderlm")
    assert dict(cfg.model.fields) == {"passes": 3, "gate_init_bias": None}
    assert cfg.to_dict()["model"] == written and list(cfg.to_dict()["model"]) == list(written)  # order kept
    mc = cfg.model_config()
    assert (mc.mode, mc.num_passes) == ("ponderlm", 3)
    assert _train({"size": "tiny"}).model.recurrence == "adaponder"  # not written: the default mode


def test_a_full_model_mapping_needs_no_preset():
    full = {"mode": "loop", "passes": 2, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64}
    cfg = _train(full)
    assert cfg.model.size is None and cfg.model_config().hidden_size == 32
    assert cfg.to_dict()["model"] == full


def test_continued_pretraining_overrides_leave_out_shape_keys_set_to_null():
    section = ModelSection.from_mapping({"size": None, "vocab_size": None, "passes": 4, "input_scale": 3.0})
    assert section.backbone_overrides() == ("adaponder", {"passes": 4, "input_scale": 3.0})


def test_every_configuration_error_is_one_class():
    from adaponder.modeling import AdaPonderConfig, AdaPonderConfigError

    with pytest.raises(AdaPonderConfigError) as model_err:
        AdaPonderConfig.from_mapping({"mode": "nope", "halting_threshold": 2.0})
    with pytest.raises(TrainConfigError) as train_err:
        _train({"size": "tiny"}, optim={"lr": -1})
    with pytest.raises(FinetuneConfigError) as finetune_err:
        load_finetune_config(base={"task": "sst2", "train": {"lr": -1}})
    for err in (model_err, train_err, finetune_err):
        assert isinstance(err.value, ConfigError) and isinstance(err.value, ValueError)
        assert err.value.problems
    assert len(model_err.value.problems) == 2  # every problem at once, as the other configurations


def test_fine_tuning_reuses_the_checkpoint_and_logging_sections_with_its_own_defaults():
    assert issubclass(CheckpointSection, CheckpointSettings) and issubclass(CheckpointConfig, CheckpointSettings)
    assert issubclass(LoggingSection, LoggingSettings) and issubclass(LoggingConfig, LoggingSettings)
    shared = {f.name for f in dataclasses.fields(CheckpointSettings)}
    assert shared <= {f.name for f in dataclasses.fields(CheckpointSection)}
    assert {f.name for f in dataclasses.fields(CheckpointSection)} == shared  # no pretraining-only key
    assert (CheckpointSection().every, CheckpointSection().keep, CheckpointConfig().every) == (0, 2, 1000)
    assert (LoggingSection().wandb_project, LoggingConfig().wandb_project) == ("adaponder-glue", "adaponder")
    with pytest.raises(FinetuneConfigError, match="checkpoint.export_hf: unknown key"):
        load_finetune_config(base={"task": "sst2", "checkpoint": {"export_hf": True}})


@pytest.mark.parametrize("ds, message", [
    ({"zero_stage": 0, "offload_optimizer": "cpu"}, "deepspeed.offload_optimizer: needs zero_stage >= 1"),
    ({"zero_stage": 2, "offload_param": "cpu"}, "deepspeed.offload_param: needs zero_stage 3"),
    ({"zero_stage": 3, "offload_param": "nvme"}, "deepspeed.nvme_path: required for nvme offload"),
])
def test_pretraining_and_fine_tuning_refuse_the_same_deepspeed_settings_in_the_same_words(ds, message):
    with pytest.raises(TrainConfigError) as train_err:
        _train({"size": "tiny"}, deepspeed=ds)
    with pytest.raises(FinetuneConfigError) as finetune_err:
        load_finetune_config(base={"task": "sst2", "deepspeed": ds})
    assert message in train_err.value.problems
    assert message in finetune_err.value.problems


def test_the_data_functions_take_the_typed_data_section(tmp_path):
    data = DataConfig(path=str(tmp_path / "prepared"))
    assert training_source(data) == DataSource("packed", data.path, split="train")
    assert validation_source(data) == DataSource("packed", data.path, split="val")
    assert training_source(DataConfig(format="indexed", path="pile/x", order="documents")) \
        == DataSource("indexed", "pile/x", order="documents")


def test_both_training_loaders_follow_the_loader_protocol(tmp_path):
    from adaponder.data.indexed import IndexedLoader, write_indexed
    from adaponder.data.loader import PackedLoader
    from adaponder.data.prepare import prepare
    from adaponder.data.tokenizer import load_tokenizer

    rng = np.random.default_rng(0)
    prefix = write_indexed(tmp_path / "idx", [rng.integers(1, 90, 200).tolist() for _ in range(4)])
    src = tmp_path / "texts"
    src.mkdir()
    for i in range(10):
        (src / f"{i}.txt").write_text(f"document {i} " + "words and more words " * 40)
    prepare([str(src)], tmp_path / "packed", val_fraction=0.2, progress=False)
    tok = load_tokenizer()
    makers = [lambda: IndexedLoader(prefix, "documents", seq_len=16, micro_batch_size=2, vocab_size=97),
              lambda: PackedLoader(tmp_path / "packed", seq_len=16, micro_batch_size=2, tokenizer_fingerprint=tok)]
    for make in makers:
        loader = make()
        assert isinstance(loader, TokenLoader)
        batches = iter(loader)
        assert tuple(next(batches).shape) == (2, 17)
        fresh = make()
        fresh.load_state_dict(loader.state_dict())
        assert (next(iter(fresh)) == next(batches)).all()  # exactly the next batch
