"""What killed tools leave on disk, and an export error that spoke of ``--resume``.

* a killed ``adaponder-prepare`` leaves ``.NAME.tmp-<pid>-<hex>`` (as large as the token stream): the next run
  for the same output removes it (and a replaced output not yet deleted, ``.NAME.old-<hex>``), but not the
  temporary folder of a prepare still running;
* a killed export leaves ``.NAME.tmp-<pid>``: the next export to the same folder removes it;
* ``export_hf.py`` errors name the checkpoint argument, not ``--resume``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaponder.cli.export_hf import main as export_main
from adaponder.data.prepare import prepare
from adaponder.train.export import write_atomically


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _fill(folder: Path, size: int = 1 << 16) -> Path:
    folder.mkdir(parents=True)
    (folder / "stream.tmp").write_bytes(b"\0" * size)
    return folder


@pytest.mark.integration
def test_prepare_removes_the_temporary_folders_of_killed_runs(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("A short document about pondering. " * 40)
    out = tmp_path / "prepared"
    dead = _fill(tmp_path / f".prepared.tmp-{_dead_pid()}-1a2b3c4d")  # named as prepare names them
    old = _fill(tmp_path / ".prepared.old-5e6f7a8b")
    live = _fill(tmp_path / f".prepared.tmp-{os.getpid()}-0badcafe")  # a prepare that is still running
    other = _fill(tmp_path / f".otherdata.tmp-{_dead_pid()}-1a2b3c4d")  # another output's: not ours to judge
    prepare([str(tmp_path / "docs")], out, val_fraction=0, progress=False)
    assert (out / "meta.json").is_file()
    assert not dead.exists() and not old.exists()
    assert live.exists() and other.exists()
    err = capsys.readouterr().err
    assert f"removed {dead} (65,536 bytes), left by an interrupted adaponder-prepare" in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".prepared.")) == [live.name]


@pytest.mark.integration
def test_export_removes_the_temporary_folders_of_killed_exports(tmp_path):
    out = tmp_path / "hf"
    dead = _fill(tmp_path / f".hf.tmp-{_dead_pid()}")
    live = _fill(tmp_path / f".hf.tmp-{os.getppid()}")  # a live process's export (here: our parent's pid)
    write_atomically(out, lambda folder: (folder / "config.json").write_text("{}"))
    assert (out / "config.json").is_file() and not dead.exists() and live.exists()


def test_export_errors_name_the_checkpoint_argument_not_resume(tmp_path, capsys):
    missing = tmp_path / "no-such-run" / "checkpoints"
    assert export_main([str(missing), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"error: checkpoint {missing}: no such checkpoint folder" in err and "--resume" not in err
    ck = tmp_path / "run" / "checkpoints"
    ck.mkdir(parents=True)
    (ck / "latest").write_text("step00000009")
    assert export_main([str(ck), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "latest names 'step00000009'" in err and "--resume" not in err
    assert not (tmp_path / "out").exists()
