"""User errors of ``launch/finetune_glue.py``: a missing TSV, a row without a tab or
with the wrong number of columns, an unknown label, a model name that cannot be resolved, and GLUE given twice or
not at all each end in ONE line naming what is wrong (file and line for a TSV), exit code 2, no traceback — unless
``--debug`` (the shared wrapper of :mod:`adaponder.cli.errors`).

Every input is checked before fine-tuning joins a process group (see ``FineTuner.__init__``), so these runs are
safe in pytest's own process.
"""

import pytest

from adaponder.cli.finetune_glue import main
from conftest import REPO

RTE = REPO / "configs" / "glue" / "rte.yaml"
HEADER = "index\tsentence1\tsentence2\tlabel\n"
GOOD_ROW = "0\tA man sleeps.\tSomeone sleeps.\tentailment\n"


def _glue(tmp_path, train_rows: str, dev: bool = True):
    folder = tmp_path / "glue" / "RTE"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text(HEADER + train_rows, encoding="utf-8")
    if dev:
        (folder / "dev.tsv").write_text(HEADER + GOOD_ROW, encoding="utf-8")
    return tmp_path / "glue"


def _one_line_error(capsys, argv) -> str:
    rc = main(["--config", str(RTE), "--output", "unused", *argv])
    captured = capsys.readouterr()
    text = captured.err + captured.out
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in text, text
    return errors[0]


@pytest.mark.parametrize("rows, expected", [
    (GOOD_ROW + "1\tno tab at the end of this row\n", "train.tsv:3: expected 4 tab-separated fields for RTE, got 2"),
    (GOOD_ROW + "1 no tabs at all\n", "train.tsv:3: expected 4 tab-separated fields for RTE, got 1"),
    (GOOD_ROW + "1\ta\tb\tentailment\textra\n", "train.tsv:3: expected 4 tab-separated fields for RTE, got 5"),
    ("0\ta\tb\tcontradiction\n", "train.tsv:2: unknown label 'contradiction' for RTE; expected one of "
                                 "['entailment', 'not_entailment']"),
])
def test_bad_tsv_rows_are_one_line_naming_file_and_line(tmp_path, capsys, rows, expected):
    glue = _glue(tmp_path, rows)
    line = _one_line_error(capsys, ["--init", "tiny-random", "--data-dir", str(glue)])
    assert line == f"error: {glue / 'RTE' / expected}"


def test_missing_tsv_names_the_file_and_the_layout(tmp_path, capsys):
    glue = _glue(tmp_path, GOOD_ROW, dev=False)
    line = _one_line_error(capsys, ["--init", "tiny-random", "--data-dir", str(glue)])
    assert line == (f"error: {glue / 'RTE' / 'dev.tsv'}: file not found (expected the GLUE layout "
                    "<glue_dir>/RTE/{train,dev}.tsv)")


def test_debug_keeps_the_exception(tmp_path):
    from adaponder.palbert.glue import GlueDataError

    glue = _glue(tmp_path, GOOD_ROW + "1\tbad\n")
    with pytest.raises(GlueDataError, match=r"train\.tsv:3: expected 4 tab-separated fields") as err:
        main(["--config", str(RTE), "--init", "tiny-random", "--data-dir", str(glue), "--debug"])
    assert (err.value.path, err.value.line) == (str(glue / "RTE" / "train.tsv"), 3)


def test_glue_given_twice_or_not_at_all(tmp_path, capsys, monkeypatch):
    glue = _glue(tmp_path, GOOD_ROW)
    line = _one_line_error(capsys, ["--init", "tiny-random", "--data-dir", str(glue), "--hf-dataset", "nyu-mll/glue"])
    assert "both a TSV folder" in line and "use one: --data-dir or --hf-dataset" in line
    # data.hf_dataset in the config conflicts with --data-dir just the same
    line = _one_line_error(capsys, ["--init", "tiny-random", "--data-dir", str(glue), "--set",
                                    "data.hf_dataset=nyu-mll/glue"])
    assert "both a TSV folder" in line
    for var in ("ADAPONDER_GLUE_DIR", "ADAPONDER_SHARED_DATA"):
        monkeypatch.delenv(var, raising=False)
    line = _one_line_error(capsys, ["--init", "tiny-random"])
    assert "GLUE data folder: not given: pass --data-dir" in line and "--hf-dataset" in line


def test_unresolvable_init_is_one_line(tmp_path, capsys, monkeypatch):
    glue = _glue(tmp_path, GOOD_ROW)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    line = _one_line_error(capsys, ["--init", "adaponder-test/not-cached", "--init-revision", "step5",
                                    "--data-dir", str(glue)])
    assert "adaponder-test/not-cached (revision step5) is not in the Hugging Face cache" in line
    line = _one_line_error(capsys, ["--init", str(tmp_path / "nowhere"), "--data-dir", str(glue)])
    assert line == f"error: {tmp_path / 'nowhere'}: no such checkpoint folder, and not a Hugging Face hub id (org/name)"
    line = _one_line_error(capsys, ["--init", "tiny-random", "--init-revision", "step5", "--data-dir", str(glue)])
    assert "a revision (step5) applies to a Hugging Face hub id, not to tiny-random" in line


def test_small_vocabulary_checkpoint_without_its_tokenizer_names_both_sizes(tmp_path, capsys):
    from helpers_evaluation import tiny_model, tiny_tokenizer

    glue = _glue(tmp_path, GOOD_ROW)
    ckpt = tmp_path / "small-vocab"
    tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=1000).save_pretrained(ckpt)
    tiny_tokenizer().save_pretrained(ckpt)  # its tokenizer is there, but the run uses the bundled one
    line = _one_line_error(capsys, ["--init", str(ckpt), "--data-dir", str(glue)])
    assert "the bundled tokenizer" in line and "has 50277 tokens" in line, line
    assert f"the model {ckpt} embeds only 1000 (vocab_size in its config.json)" in line, line
    assert f"--set data.tokenizer={ckpt / 'tokenizer.json'}" in line, line
