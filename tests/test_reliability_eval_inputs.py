"""Evaluation inputs that are wrong fail clearly: the local lm-eval task files (a line that is not JSON, an empty
file, a record without a key, a label outside the choices) name the file and line — in the loader and as one
``error:`` line of ``adaponder-eval`` — instead of a traceback through lm-eval or a silently wrong score."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from adaponder.cli import lm_eval as eval_cli
from adaponder.data.errors import DataError, EmptyInputError, RecordError
from helpers_evaluation import tiny_model, tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]
PIQA = [{"goal": f"goal {i}", "sol1": "a", "sol2": "b"} for i in range(3)]
ARC = {"id": "q1", "question": {"stem": "Why?", "choices": [{"text": "x", "label": "A"}, {"text": "y", "label": "B"}]},
       "answerKey": "B"}


@pytest.fixture(scope="module")
def tasks():
    """eval/tasks/utils.py, loaded from its file as lm-eval loads it."""
    spec = importlib.util.spec_from_file_location("adaponder_eval_task_utils", REPO / "eval" / "tasks" / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(root: Path, rel: str, lines: list) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _piqa(root: Path, records: list, labels: list[str]) -> Path:
    _write(root, "piqa/valid-labels.lst", labels)
    return _write(root, "piqa/valid.jsonl", records)


@pytest.mark.parametrize("records, labels, error, where, text", [
    ([PIQA[0], "{not json", PIQA[2]], ["0", "1", "0"], RecordError, "valid.jsonl:2", "not a JSON line"),
    ([PIQA[0], "", {"goal": "g", "sol1": "a"}], ["0", "1"], RecordError, "valid.jsonl:3", "no key 'sol2'"),
    (PIQA, ["0", "2", "1"], RecordError, "valid-labels.lst:2", "label '2' is out of range; expected one of"),
    ([], ["0"], EmptyInputError, "valid.jsonl", "the file is empty"),
    (PIQA, ["0", "1"], RecordError, "valid.jsonl holds 3 questions but", "2 labels"),
], ids=["bad-json-line", "missing-key", "label-out-of-range", "empty-file", "count-mismatch"])
def test_piqa_files_name_file_and_line(tasks, tmp_path, records, labels, error, where, text):
    _piqa(tmp_path, records, labels)
    with pytest.raises(error) as info:
        tasks.load_piqa(str(tmp_path))
    message = str(info.value)
    assert str(tmp_path / "piqa") in message and where in message and text in message, message


def test_other_tasks_refuse_answers_outside_their_choices(tasks, tmp_path):
    path = _write(tmp_path, "arc_easy/ARC-Easy-Test.jsonl", [ARC, {**ARC, "answerKey": "E"}])
    with pytest.raises(RecordError, match=f"{path}:2: answerKey 'E' is out of range; expected one of"):
        tasks.load_arc_easy(str(tmp_path))
    wino = {"sentence": "_ won.", "option1": "A", "option2": "B", "answer": "3"}
    path = _write(tmp_path, "winogrande/dev.jsonl", [wino])
    with pytest.raises(RecordError, match=f"{path}:1: answer '3' is out of range"):
        tasks.load_winogrande(str(tmp_path))
    path = _write(tmp_path, "sciq/test.json", ['[{"question": "q",', '  "support": }]'])
    with pytest.raises(RecordError, match=f"{path}:2: not valid JSON"):
        tasks.load_sciq(str(tmp_path))
    _write(tmp_path, "arc_easy/ARC-Easy-Test.jsonl", [ARC])
    assert tasks.load_arc_easy(str(tmp_path))["test"][0]["answerKey"] == "B"  # a good file still loads


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("eval_inputs") / "ckpt"
    tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=1000,
               max_position_embeddings=128).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.mark.integration
def test_adaponder_eval_names_the_bad_task_file_in_one_error_line(ckpt, tmp_path, capsys, one_thread):
    path = _piqa(tmp_path, [PIQA[0], PIQA[1], "[1, 2"], ["0", "1", "0"])
    code = eval_cli.main([str(ckpt), "--tasks", "adaponder_piqa", "--limit", "2", "--device", "cpu",
                          "--metadata", json.dumps({"adaponder_eval_data": str(tmp_path)})])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1].startswith("error: ") and f"{path}:3: not a JSON line" in err[-1], err
    assert not any("Traceback" in line for line in err), err
    assert issubclass(RecordError, DataError)
