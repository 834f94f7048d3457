"""The model refuses input it cannot run on correctly, naming what is wrong, before any pass: more positions
than ``max_position_embeddings`` (forward, with a cache, in pause mode, and a generation whose prompt plus
``max_new_tokens`` would not fit), float or 3-D ids, and labels with nothing to score (the loss would be NaN)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaponder.errors import is_user_error
from adaponder.modeling import AdaPonderForCausalLM
from adaponder.generation.depth_batching import DepthBatchedDecoder
from adaponder.modeling.input_checks import ModelInputError
from conftest import tiny_config

CONTEXT = 32


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return AdaPonderForCausalLM(tiny_config(max_position_embeddings=CONTEXT)).eval()


def _ids(length: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 97, (batch, length))


def _raises(call, *texts: str) -> ModelInputError:
    with pytest.raises(ModelInputError) as info:
        call()
    for text in texts:
        assert text in str(info.value), (text, str(info.value))
    assert is_user_error(info.value)  # one error: line on the command line
    return info.value


def test_forward_past_the_positions_names_both_numbers(model):
    model(_ids(CONTEXT))  # exactly the context fits
    _raises(lambda: model(_ids(CONTEXT + 1)), "needs 33 positions (33 tokens)", f"max_position_embeddings ({CONTEXT})")
    out = model(_ids(CONTEXT - 2), use_cache=True)
    model(_ids(2), cache=out.cache)  # fills the context
    _raises(lambda: model(_ids(1), cache=out.cache), "needs 33 positions (32 cached positions + 1 tokens)")


def test_pause_mode_counts_the_pauses():
    pause = AdaPonderForCausalLM(tiny_config("pause", pause_tokens=3, max_position_embeddings=CONTEXT)).eval()
    pause(_ids(8))
    _raises(lambda: pause(_ids(9)), "needs 36 positions (9 tokens × 4 positions (1 + 3 pauses))",
            f"max_position_embeddings ({CONTEXT})")


def test_generate_past_the_positions_names_prompt_new_tokens_and_context(model):
    model.generate(_ids(CONTEXT - 4), max_new_tokens=4, do_sample=False)
    _raises(lambda: model.generate(_ids(30), max_new_tokens=5, do_sample=False),
            "generating 5 new tokens after a prompt of 30 needs 35 positions", f"max_position_embeddings ({CONTEXT})")
    _raises(lambda: model.generate(_ids(10), max_length=40, do_sample=False), "up to max_length 40 tokens")
    _raises(lambda: DepthBatchedDecoder(model).generate(_ids(30), max_new_tokens=5),
            "generating 5 new tokens after a prompt of 30 needs 35 positions")


@pytest.mark.parametrize("call, text", [
    (lambda m: m(torch.rand(1, 4) * 90), "input_ids must hold integer token ids (torch.long), got dtype torch.float32"),
    (lambda m: m.generate(torch.rand(1, 4), max_new_tokens=2), "got dtype torch.float32"),
    (lambda m: m(_ids(8).reshape(2, 2, 2)), "input_ids must be [batch, length], got shape (2, 2, 2)"),
    (lambda m: m(_ids(4)[0]), "input_ids must be [batch, length], got shape (4,)"),
    (lambda m: m(inputs_embeds=torch.zeros(4, 64)), "inputs_embeds must be [batch, length, hidden], got shape (4, 64)"),
], ids=["float", "generate-float", "3d", "1d", "embeds-2d"])
def test_ids_of_a_wrong_dtype_or_shape_are_refused(model, call, text):
    _raises(lambda: call(model), text)


def test_labels_with_nothing_to_score_are_an_error_not_nan(model):
    ids = _ids(4)
    _raises(lambda: model(ids, labels=torch.full_like(ids, -100)), "labels hold no target to score",
            "every value is -100", "the loss would be NaN")
    # labels are shifted: a row whose only label is the first one has no target either
    _raises(lambda: model(ids, labels=torch.tensor([[7, -100, -100, -100]])), "labels[..., 1:]")
    _raises(lambda: model(ids, shift_labels=torch.full_like(ids, -100)), "shift_labels hold no target to score")
    out = model(ids, labels=torch.tensor([[-100, -100, 5, -100]]))  # one target is enough
    assert torch.isfinite(out.loss)


def test_evaluation_windows_count_the_pauses():
    """In pause mode a token takes 1 + num_pauses positions: the default perplexity window fits the positions
    (it was max_position_embeddings tokens, now refused by the position check) and a larger one is refused."""
    from adaponder.evaluation.perplexity import Document, default_window, score_documents
    from adaponder.modeling.input_checks import context_note, context_tokens

    pause = AdaPonderForCausalLM(tiny_config("pause", pause_tokens=3, max_position_embeddings=CONTEXT)).eval()
    assert context_tokens(pause.config) == default_window(pause) == 8
    assert context_note(pause.config) == f"max_position_embeddings {CONTEXT} / (1 + 3 pauses)"
    with pytest.raises(ValueError, match=r"window 9 exceeds the model's context of 8 tokens"):
        score_documents(pause, [Document("d", np.arange(20), 20)], window=9)
    scores = score_documents(pause, [Document("d", np.arange(20), 20)])  # the default window runs
    assert len(scores) == 20
