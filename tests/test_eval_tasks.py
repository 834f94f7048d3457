"""The local lm-eval tasks in eval/tasks must build exactly the requests of lm-eval's official tasks.

The official tasks would download their HF datasets, so each official YAML is loaded from the
installed lm-eval and fed the same documents: the original files converted to the HF schema by
converters written here independently of eval/tasks/utils.py, injected via ``custom_dataset``.
Only the data source and the split names/roles may differ (see the README); everything that
shapes a request (prompts, choices, targets, delimiters, preprocessing, metrics, sampler) is
compared as config, then ``Instance.arguments`` are compared request by request, 0- and 5-shot.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

datasets = pytest.importorskip("datasets")
pytest.importorskip("lm_eval")
from lm_eval.api.task import ConfigurableTask  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from lm_eval.tasks._yaml_loader import load_yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASKS_DIR = REPO / "eval" / "tasks"
DATA = Path(os.environ.get("ADAPONDER_EVAL_DATA") or REPO.parent / "shared" / "data" / "eval")
TOKENIZER = REPO.parent / "shared" / "data" / "tokenizers" / "gpt-neox-20b" / "tokenizer.json"
LIMIT = 50
SEED = 1234  # simple_evaluate's default fewshot_random_seed
SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")
# Config fields allowed to differ from the official task: naming, data source, split roles.
ALLOWED_DIFF = {"task", "task_alias", "tag", "custom_dataset", "dataset_path", "dataset_name",
                "dataset_kwargs", "metadata", *SPLIT_KEYS}

needs_data = pytest.mark.skipif(not (DATA / "piqa" / "valid.jsonl").is_file(), reason=f"no eval data at {DATA}")


# --- independent original-format -> HF-schema converters ---------------------------------------


def _jsonl(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def _lines(path):
    return Path(path).read_text(encoding="utf-8").split()


def hf_docs(name: str, root: Path) -> list[dict]:
    """Documents as the HF dataset behind the official task would yield them."""
    if name == "lambada_openai":  # EleutherAI/lambada_openai, default config
        return [{"text": r["text"]} for r in _jsonl(root / "lambada_openai/lambada_test.jsonl")]
    if name == "piqa":  # baber/piqa
        recs, labels = _jsonl(root / "piqa/valid.jsonl"), _lines(root / "piqa/valid-labels.lst")
        return [{"goal": r["goal"], "sol1": r["sol1"], "sol2": r["sol2"], "label": int(y)} for r, y in zip(recs, labels)]
    if name in ("arc_easy", "arc_challenge"):  # allenai/ai2_arc
        fname = {"arc_easy": "ARC-Easy", "arc_challenge": "ARC-Challenge"}[name]
        out = []
        for r in _jsonl(root / name / f"{fname}-Test.jsonl"):
            q = r["question"]
            out.append({"id": r["id"], "question": q["stem"],
                        "choices": {"text": [c["text"] for c in q["choices"]], "label": [c["label"] for c in q["choices"]]},
                        "answerKey": r["answerKey"]})
        return out
    if name == "sciq":  # allenai/sciq
        return json.loads((root / "sciq/test.json").read_text(encoding="utf-8"))
    if name == "winogrande":  # allenai/winogrande, winogrande_xl validation
        labels = _lines(root / "winogrande/dev-labels.lst")
        return [{"sentence": r["sentence"], "option1": r["option1"], "option2": r["option2"], "answer": y}
                for r, y in zip(_jsonl(root / "winogrande/dev.jsonl"), labels)]
    if name == "hellaswag":  # Rowan/hellaswag: label is a string
        return [{**r, "label": str(r["label"])} for r in _jsonl(root / "hellaswag/hellaswag_val.jsonl")]
    raise KeyError(name)


# --- helpers ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def official_index():
    return TaskManager().task_index


def official_task(name: str, local: ConfigurableTask, docs: list[dict], index) -> ConfigurableTask:
    """The official YAML, fed `docs` under the local task's split layout."""
    cfg = load_yaml(index[name].yaml_path, resolve_func=True)
    check_split_roles(local, cfg)
    split = local.config.test_split or local.config.validation_split
    ds = datasets.DatasetDict({split: datasets.Dataset.from_list(docs)})
    cfg.update(dataset_path=None, dataset_name=None, dataset_kwargs=None, custom_dataset=lambda **_: ds)
    cfg.update({k: getattr(local.config, k) for k in SPLIT_KEYS})
    return ConfigurableTask(config=cfg)


def check_split_roles(local: ConfigurableTask, official_cfg: dict):
    """The one intended difference: with no train split shipped, the few-shot pool is the evaluated split."""
    lc = local.config
    official = {k: official_cfg.get(k) for k in SPLIT_KEYS}
    if official["training_split"] is None and official["validation_split"] is None:
        # Official few-shot already comes from the test split (LAMBADA): keep its layout verbatim.
        assert {k: getattr(lc, k) for k in SPLIT_KEYS} == official
        return
    # Same evaluated split name; fewshot_split == test_split is what makes lm-eval's sampler drop the
    # evaluated doc from its own few-shot examples (api/task.py, fewshot_context).
    assert lc.test_split == (official["test_split"] or official["validation_split"])
    assert lc.training_split is None and lc.validation_split is None and lc.fewshot_split == lc.test_split


def _norm(v):
    if callable(v):  # the same function may be imported twice under the same module name
        return (getattr(v, "__module__", None), getattr(v, "__qualname__", repr(v)))
    if dataclasses.is_dataclass(v):
        return {f.name: _norm(getattr(v, f.name)) for f in dataclasses.fields(v) if f.name != "split"}
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v


def requests(task: ConfigurableTask, shots: int) -> list:
    task.set_config(key="num_fewshot", value=shots)
    task.set_fewshot_seed(SEED)
    task.build_all_requests(limit=LIMIT)
    return [(i.request_type, i.doc_id, i.idx, i.arguments, i.doc) for i in task.instances]


def assert_same_as_official(local: ConfigurableTask, official: ConfigurableTask):
    lc, oc = local.config, official.config
    diff = {f.name for f in dataclasses.fields(lc) if _norm(getattr(lc, f.name)) != _norm(getattr(oc, f.name))}
    assert diff <= ALLOWED_DIFF, f"{lc.task}: config differs from official in {sorted(diff - ALLOWED_DIFF)}"
    assert len(local.eval_docs) == len(official.eval_docs)
    for shots in (0, 5):
        got, want = requests(local, shots), requests(official, shots)
        assert len(got) == len(want) > 0
        for g, w in zip(got, want):
            assert g == w, f"{lc.task} {shots}-shot doc {g[1]} idx {g[2]}"


# --- tests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_tasks():
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"adaponder_eval_data": str(DATA)})
    return tm.load(["adaponder_suite"])


@needs_data
def test_group_and_names(local_tasks):
    assert local_tasks["group_map"]["adaponder_suite"] == [
        "adaponder_lambada_openai", "adaponder_piqa", "adaponder_arc_easy",
        "adaponder_arc_challenge", "adaponder_sciq", "adaponder_winogrande"]
    tm = TaskManager(include_path=str(TASKS_DIR))  # with the official tasks: names must not collide
    assert {"adaponder_hellaswag", "adaponder_suite_full", "piqa", "hellaswag"} <= set(tm.all_tasks)


@needs_data
@pytest.mark.parametrize("name", ["lambada_openai", "piqa", "arc_easy", "arc_challenge", "sciq", "winogrande"])
def test_requests_match_official(name, local_tasks, official_index):
    local = local_tasks["tasks"][f"adaponder_{name}"]
    assert_same_as_official(local, official_task(name, local, hf_docs(name, DATA), official_index))


def _hellaswag_record(i: int) -> dict:
    # Same shape as rowanz/hellaswag data/hellaswag_val.jsonl, with the WikiHow artifacts
    # ([title], [step], [header]) the official process_docs strips.
    wikihow = i % 2 == 0
    ctx_a = f"[header] How to task {i} [title] Gather things {i}." if wikihow else f"A man is doing thing {i}."
    ctx_b = "then [step] he starts" if wikihow else "he picks up the bar"
    return {"ind": 100 + i, "activity_label": f"Activity {i % 3}", "ctx_a": ctx_a, "ctx_b": ctx_b,
            "ctx": f"{ctx_a} {ctx_b}", "split": "val", "split_type": "indomain" if i % 3 else "zeroshot",
            "label": i % 4, "endings": [f" ending {j} of {i} [substeps] more." for j in range(4)],
            "source_id": f"activitynet~v_{i}" if not wikihow else f"wikihow~{i}"}


def test_hellaswag_from_original_file(tmp_path, monkeypatch, official_index):
    (tmp_path / "hellaswag").mkdir()
    with (tmp_path / "hellaswag" / "hellaswag_val.jsonl").open("w") as fh:
        for i in range(12):
            fh.write(json.dumps(_hellaswag_record(i)) + "\n")
    monkeypatch.setenv("ADAPONDER_EVAL_DATA", str(tmp_path))  # the environment-variable route
    local = TaskManager(include_path=str(TASKS_DIR), include_defaults=False).load(["adaponder_hellaswag"])
    local = local["tasks"]["adaponder_hellaswag"]
    assert "[" not in local.eval_docs[0]["query"]  # official preprocessing ran
    assert_same_as_official(local, official_task("hellaswag", local, hf_docs("hellaswag", tmp_path), official_index))
    # With 5 shots out of 12 docs a self-sample is near certain unless the sampler excludes the doc.
    requests(local, 5)
    for inst in local.instances:
        doc = inst.doc
        assert f"{doc['query']} {doc['choices'][doc['gold']]}\n\n" not in inst.arguments[0]


def test_missing_data_is_explained(tmp_path):
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"adaponder_eval_data": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="ADAPONDER_EVAL_DATA"):
        tm.load(["adaponder_hellaswag"])


@pytest.fixture(scope="module")
def tiny_pythia(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not TOKENIZER.is_file():
        pytest.skip(f"no tokenizer at {TOKENIZER}")
    out = tmp_path_factory.mktemp("tiny_pythia")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER), eos_token="<|endoftext|>", bos_token="<|endoftext|>",
        unk_token="<|endoftext|>", pad_token="<|padding|>")
    tok.save_pretrained(out)
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(vocab_size=50304, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=256, max_position_embeddings=2048,
                                     bos_token_id=0, eos_token_id=0)
    transformers.GPTNeoXForCausalLM(cfg).save_pretrained(out)
    return out


@pytest.mark.integration
@needs_data
def test_simple_evaluate_smoke(tiny_pythia):
    from lm_eval import simple_evaluate

    tm = TaskManager(include_path=str(TASKS_DIR), metadata={"adaponder_eval_data": str(DATA)})
    tasks = ["adaponder_lambada_openai", "adaponder_piqa", "adaponder_winogrande"]
    out = simple_evaluate(model="hf", model_args=f"pretrained={tiny_pythia},dtype=float32", tasks=tasks,
                          num_fewshot=1, limit=5, task_manager=tm, device="cpu", batch_size=4)
    res = out["results"]
    expected = {"adaponder_lambada_openai": ("perplexity,none", "acc,none"),
                "adaponder_piqa": ("acc,none", "acc_norm,none"),
                "adaponder_winogrande": ("acc,none",)}
    for task, metrics in expected.items():
        for m in metrics:
            assert isinstance(res[task][m], float), (task, m, res[task])
        assert out["n-shot"][task] == 1
    assert res["adaponder_lambada_openai"]["perplexity,none"] > 1.0
    assert 0.0 <= res["adaponder_piqa"]["acc,none"] <= 1.0
