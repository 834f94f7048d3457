"""lm-eval's HFLM runs a generate_until task with the model and its PonderCache."""

import json

import pytest
import torch


def _arithmetic_task(folder, name: str, pairs, until: str, max_gen_toks: int) -> None:
    """A local generate_until task ``name`` in ``folder``: "Q: What is a plus b?" answered by exact match."""
    docs = [{"question": f"What is {a} plus {b}?", "answer": str(a + b)} for a, b in pairs]
    data = folder / "docs.jsonl"
    data.write_text("\n".join(json.dumps(d) for d in docs))
    (folder / f"{name}.yaml").write_text(f"""
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: [{json.dumps(until)}]
  max_gen_toks: {max_gen_toks}
  do_sample: false
metric_list:
  - metric: exact_match
""")


@pytest.mark.integration
def test_hflm_generate_until_with_tiny_local_task(tmp_path, shared_data):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import PreTrainedTokenizerFast

    from adaponder.modeling import AdaPonderForCausalLM
    from conftest import run_with, tiny_config

    tok = PreTrainedTokenizerFast(tokenizer_file=str(shared_data / "tokenizers/gpt-neox-20b/tokenizer.json"),
                                  eos_token="<|endoftext|>", pad_token="<|padding|>")
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("adaponder", vocab_size=50304, gate_init_bias=0.0,
                                             eos_token_id=0, pad_token_id=1)).eval()
    run_with(model, tau=0.5)  # every call HFLM and the check below make runs at τ = 0.5
    _arithmetic_task(tmp_path, "tiny_generate", [(1, 2), (3, 4), (10, 5)], until="\n", max_gen_toks=6)

    hflm = HFLM(pretrained=model, tokenizer=tok, batch_size=2, max_length=64)
    results = simple_evaluate(model=hflm, tasks=["tiny_generate"], task_manager=TaskManager(include_path=str(tmp_path)),
                              log_samples=True)
    assert "exact_match,none" in results["results"]["tiny_generate"]
    samples = results["samples"]["tiny_generate"]
    assert len(samples) == 3
    # what HFLM generated is what greedy cached generation gives for the same prompt
    prompt = samples[0]["arguments"][0][0] if isinstance(samples[0]["arguments"][0], (list, tuple)) \
        else samples[0]["arguments"]["gen_args_0"]["arg_0"]
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=6, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:]).split("\n")[0]
    assert samples[0]["resps"][0][0] == text


@pytest.mark.integration
def test_generation_tasks_give_the_same_outputs_with_self_speculative_decoding(tmp_path, tmp_path_factory):
    """The ``adaponder`` lm-eval model with ``speculative_draft_tokens``, or ``decoding_schedule`` depth or pipelined:
    every generated answer of a generate_until task is the one ordinary decoding gives (greedy)."""
    import adaponder.evaluation.lm_eval_model  # noqa: F401  (registers "adaponder")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from helpers_evaluation import tiny_checkpoint

    _arithmetic_task(tmp_path, "tiny_generate_spec", [(1, 2), (3, 4), (10, 5), (7, 7)], until="\n\n",
                     max_gen_toks=12)

    ckpt = tiny_checkpoint(tmp_path_factory)
    resps = {}
    for name, extra in [("ordinary", ""), ("depth", ",decoding_schedule=depth"),
                        ("pipelined", ",decoding_schedule=pipelined"), ("speculative", ",speculative_draft_tokens=3")]:
        res = simple_evaluate(model="adaponder", model_args=f"checkpoint={ckpt}{extra}", tasks=["tiny_generate_spec"],
                              task_manager=TaskManager(include_path=str(tmp_path)), batch_size=2, device="cpu",
                              log_samples=True)
        resps[name] = [s["resps"] for s in sorted(res["samples"]["tiny_generate_spec"], key=lambda s: s["doc_id"])]
    lm = adaponder.evaluation.lm_eval_model.AdaPonderLM.instances[-1]
    assert lm.speculative is not None and lm.speculative_stats.cycles > 0  # the speculative path ran
    assert resps["speculative"] == resps["ordinary"]
    assert resps["depth"] == resps["ordinary"] and resps["pipelined"] == resps["ordinary"]
    assert any(r[0][0] for r in resps["ordinary"])  # something was generated
