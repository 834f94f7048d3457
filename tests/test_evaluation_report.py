"""``adaponder-report`` on the tiny checkpoint: report.md holds every table, the PNGs exist and are images."""

import json

import matplotlib.image as mpimg
import pytest

from conftest import SHARED_DATA
from test_evaluation_fixtures import tiny_checkpoint

TEXT = ("The old lighthouse keeper climbed the stairs every evening. He lit the lamp, wrote the weather in "
        "his log and watched the ships pass the rocks. One night the lamp failed, and he kept a fire burning "
        "on the gallery until dawn, so that no ship was lost. ") * 3


def test_report_on_tiny_checkpoint(tmp_path_factory, tmp_path):
    if not (SHARED_DATA / "eval" / "lambada_openai").is_dir():
        pytest.skip("eval data not found")
    from adaponder.evaluation.report import main

    ckpt = tiny_checkpoint(tmp_path_factory)
    data = tmp_path / "heldout.txt"
    data.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "report"
    assert main([str(ckpt), "--out", str(out), "--data", str(data), "--window", "96", "--stride", "48",
                 "--taus", "0.3,0.5,0.7", "--tasks", "adaponder_lambada_openai,adaponder_piqa", "--limit", "3",
                 "--num-fewshot", "0,5", "--lm-eval-batch-size", "4", "--bootstrap-iters", "10",
                 "--device", "cpu"]) == 0

    md = (out / "report.md").read_text(encoding="utf-8")
    for heading in ("## Recurrence settings (pinned)", "## Perplexity and bits per byte", "## Compute (A17)",
                    "## Halting: where the gates spend compute", "## Iso-FLOPs control",
                    "## Compute dial (τ sweep)", "## lm-eval"):
        assert heading in md, heading
    assert "halting threshold τ: 0.5" in md and "passes K: 4" in md
    assert "| uniform fixed pruning |" in md and "| geometric fixed pruning |" in md
    assert "| adaponder_piqa | acc |" in md and "| adaponder_lambada_openai | perplexity |" in md
    assert "0-shot | 5-shot" in md and "mean exit pass (scored tokens)" in md
    for png in ("exit_histogram.png", "nll_by_exit_pass.png", "ppl_vs_flops.png"):
        assert f"]({png})" in md
        assert (out / png).stat().st_size > 0
        img = mpimg.imread(out / png)
        assert img.shape[0] > 100 and img.shape[1] > 100

    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["halting_threshold"] == 0.5
    n_tokens = results["learned"]["tokens"]
    assert len((out / "tokens.tsv").read_text(encoding="utf-8").splitlines()) == n_tokens + 1
    target = results["target"]
    assert target == pytest.approx(results["learned"]["mean_exit"])
    assert [r["tau"] for r in results["dial"]] == [0.3, 0.5, 0.7]
    assert {(r["task"], r["num_fewshot"]) for r in results["lm_eval"]} == {
        (t, n) for t in ("adaponder_lambada_openai", "adaponder_piqa") for n in (0, 5)}
    assert all("error" not in r and r["metrics"] for r in results["lm_eval"])
