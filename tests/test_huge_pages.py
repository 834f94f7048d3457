"""The CPU entry points ask PyTorch's allocator for transparent huge pages (adaponder/huge_pages.py): a fresh
process that calls ``enable_huge_pages()`` before its first large allocation gets it backed by huge pages, one
whose user set ``THP_MEM_ALLOC_ENABLE=0`` does not."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

PROBE = """
from adaponder.huge_pages import enable_huge_pages
on = enable_huge_pages()
import torch
x = torch.ones(64 << 20 >> 2)  # 64 MiB
kb = [int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages")][0]
print(on, kb)
"""


def _probe(env_value):
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if env_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    on, kb = out.stdout.split()
    return on == "True", int(kb)


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text() or not Path("/proc/self/smaps_rollup").exists(),
                    reason="the kernel offers no transparent huge pages here")
def test_entry_points_get_huge_pages_unless_the_user_turned_them_off():
    on, kb = _probe(None)
    assert on and kb >= 32 << 10  # most of the 64 MiB tensor
    on, kb = _probe("0")
    assert not on
    if "[madvise]" in THP.read_text():  # ("always" backs every large mapping, asked or not)
        assert kb < 32 << 10
