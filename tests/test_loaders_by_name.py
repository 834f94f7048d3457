"""Models by name in every public loader: the Python API (``from_backbone`` and ``from_pretrained`` of the language
model and of the PALBERT classifier, ``load_for_eval``, ``load_tokenizer_for``, the ``adaponder`` lm-eval model) and
the evaluation commands take a Hugging Face hub id with a revision, resolved through the same code as ``init.backbone``
(:func:`adaponder.hub.resolve_pretrained`): offline, an id missing from the cache is the same error naming the id;
a cached revision loads; a local folder still works.
"""

import shutil

import pytest
import torch

from conftest import tiny_config

MISSING = "adaponder-test/not-cached"
CACHED = "adaponder-test/tiny-adaponder"
NOT_CACHED = f"{MISSING} (revision main) is not in the Hugging Face cache"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from adaponder.modeling import AdaPonderForCausalLM

    root = tmp_path_factory.mktemp("loaders")
    torch.manual_seed(0)
    folder = root / "tiny"
    AdaPonderForCausalLM(tiny_config()).save_pretrained(folder)
    # A Hugging Face cache holding revision "step5" of CACHED, laid out as snapshot_download leaves it.
    cache = root / "hf-cache"
    repo = cache / ("models--" + CACHED.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "step5").write_text(commit)
    text = root / "held-out.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\n")
    return {"folder": folder, "cache": cache, "text": text, "root": root}


@pytest.fixture(autouse=True)
def offline_cache(ckpt, monkeypatch):
    """Offline, with the test's own cache (huggingface_hub reads its cache folder from this constant per call)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(ckpt["cache"]))


def _lm_from_backbone(name, revision):
    from adaponder.modeling import AdaPonderForCausalLM

    return AdaPonderForCausalLM.from_backbone(name, revision=revision)


def _classifier_from_backbone(name, revision):
    from adaponder.palbert.classifier import AdaPonderForSequenceClassification

    return AdaPonderForSequenceClassification.from_backbone(name, revision=revision)


def _load_for_eval(name, revision):
    from adaponder.evaluation.settings import load_for_eval

    return load_for_eval(name, revision=revision)[0]


def _load_tokenizer_for(name, revision):
    from adaponder.evaluation.settings import load_tokenizer_for

    return load_tokenizer_for(name, revision=revision)


def _lm_eval_model(name, revision):
    from adaponder.evaluation.lm_eval_model import AdaPonderLM

    return AdaPonderLM(checkpoint=name, revision=revision, device="cpu", dtype="float32")


def _lm_from_pretrained(name, revision):
    from adaponder.modeling import AdaPonderForCausalLM

    return AdaPonderForCausalLM.from_pretrained(name, revision=revision)


def _classifier_from_pretrained(name, revision):
    from adaponder.palbert.classifier import AdaPonderForSequenceClassification

    return AdaPonderForSequenceClassification.from_pretrained(name, revision=revision)


LOADERS = {"from_backbone": _lm_from_backbone, "classifier.from_backbone": _classifier_from_backbone,
           "from_pretrained": _lm_from_pretrained, "classifier.from_pretrained": _classifier_from_pretrained,
           "load_for_eval": _load_for_eval, "load_tokenizer_for": _load_tokenizer_for, "AdaPonderLM": _lm_eval_model}


@pytest.mark.parametrize("loader", list(LOADERS))
def test_uncached_hub_id_offline_is_the_hub_error_naming_the_id(loader):
    from adaponder.hub import HubError

    with pytest.raises(HubError) as err:
        LOADERS[loader](MISSING, "main")
    assert NOT_CACHED in str(err.value) and "HF_HUB_OFFLINE" in str(err.value)


def test_cached_hub_revision_and_local_folder_load_the_same_weights(ckpt):
    by_name = _lm_from_backbone(CACHED, "step5").state_dict()
    by_folder = _lm_from_backbone(ckpt["folder"], None).state_dict()
    assert by_name.keys() == by_folder.keys()
    assert all(torch.equal(by_name[k], by_folder[k]) for k in by_name)
    model = _load_for_eval(CACHED, "step5")
    assert torch.equal(model.state_dict()["gpt_neox.embed_in.weight"], by_folder["gpt_neox.embed_in.weight"])
    classifier = _classifier_from_backbone(CACHED, "step5")
    assert torch.equal(classifier.core.gpt_neox.embed_in.weight, by_folder["gpt_neox.embed_in.weight"])
    loaded = _lm_from_pretrained(CACHED, "step5").state_dict()  # transformers' own loader, from the cache
    assert all(torch.equal(loaded[k], by_folder[k]) for k in by_folder)


def test_revision_with_a_local_folder_is_refused(ckpt):
    from adaponder.hub import HubError

    with pytest.raises(HubError, match="applies to a Hugging Face hub id"):
        _lm_from_backbone(ckpt["folder"], "step5")


def _commands(ckpt):
    from adaponder.cli import dial, difficulty, halting, lm_eval, perplexity, report

    data = ["--data", str(ckpt["text"])]
    return {
        "adaponder-perplexity": (perplexity.main, [MISSING, "--revision", "main", *data, "--device", "cpu"]),
        "adaponder-dial": (dial.main, [MISSING, "--revision", "main", *data]),
        "adaponder-halting": (halting.main, [MISSING, "--revision", "main", *data, "--device", "cpu"]),
        "adaponder-report": (report.main, [MISSING, "--revision", "main", *data, "--out", str(ckpt["root"] / "r"),
                                           "--no-lm-eval", "--device", "cpu"]),
        "adaponder-difficulty": (difficulty.main, [MISSING, "--revision", "main", "--data", str(ckpt["root"])]),
        "adaponder-eval": (lm_eval.main, [MISSING, "--model_args", "revision=main", "--tasks",
                                          "adaponder_lambada_openai", "--limit", "2"]),
    }


@pytest.mark.parametrize("command", ["adaponder-perplexity", "adaponder-dial", "adaponder-halting", "adaponder-report",
                                     "adaponder-difficulty", "adaponder-eval"])
def test_evaluation_commands_take_a_hub_id_and_revision(command, ckpt, capsys):
    main, argv = _commands(ckpt)[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and NOT_CACHED in err, err


def test_perplexity_scores_a_cached_hub_revision(ckpt, capsys):
    from adaponder.cli import perplexity

    code = perplexity.main([CACHED, "--revision", "step5", "--data", str(ckpt["text"]), "--device", "cpu",
                            "--window", "16"])
    out = capsys.readouterr()
    # The bundled tokenizer's ids exceed the tiny vocabulary: the error proves the model was found and read.
    assert code == 2 and "vocabulary (size 97)" in out.err, out.err
