"""The prepared GPU script (`eval/gpu_check.sh`), run in its smoke mode: every step at a tiny size on the CPU, so
the script a lent GPU will run is known to work before one is lent."""

import hashlib
import os
import subprocess

import pytest

from conftest import REPO

pytestmark = pytest.mark.integration

TABLES = ("train70m", "train410m", "infer70m", "compiled", "speculative", "generation", "pipelined")


def test_every_step_of_the_gpu_check_runs_at_a_tiny_size_on_the_cpu(tmp_path):
    benchmarks = REPO / "docs" / "benchmarks.md"
    before = hashlib.sha256(benchmarks.read_bytes()).hexdigest()
    env = dict(os.environ, GPU_CHECK_OUT=str(tmp_path), OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", str(REPO / "eval" / "gpu_check.sh"), "--smoke"], env=env, capture_output=True,
                       text=True, timeout=3600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "gpu_check smoke: every step ran" in p.stdout
    for name in TABLES:
        assert (tmp_path / f"{name}.txt").stat().st_size > 0 and (tmp_path / f"{name}.json").stat().st_size > 0
    assert "failed" not in (tmp_path / "pipelined.txt").read_text() + (tmp_path / "generation.txt").read_text()
    assert "token compiled" in (tmp_path / "generation.txt").read_text()  # every strategy of the one entry ran
    assert hashlib.sha256(benchmarks.read_bytes()).hexdigest() == before  # a smoke run writes no figures


def test_the_gpu_check_names_an_unknown_argument():
    p = subprocess.run(["bash", str(REPO / "eval" / "gpu_check.sh"), "--smok"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == "error: unknown argument --smok (expected nothing, or --smoke)"
