"""adaponder.core_modes: the classifier-core modes are modes of the one MODES list, the adaponder → ponderlm
mapping, the attention implementations equal the model configuration's copy, and an import that loads
neither torch nor transformers (configuration modules use it)."""

import subprocess
import sys

import pytest

from adaponder.core_modes import ATTN_IMPLEMENTATIONS, CLASSIFIER_CORE_MODES, CORE_MODE_CHOICES, classifier_core_mode
from adaponder.modeling import configuration_adaponder
from adaponder.modeling.configuration_adaponder import MODES


def test_core_modes_are_modes():
    assert set(CLASSIFIER_CORE_MODES) <= set(MODES) and set(CORE_MODE_CHOICES) <= set(MODES)
    assert "pause" not in CORE_MODE_CHOICES and "adaponder" not in CLASSIFIER_CORE_MODES
    assert {classifier_core_mode(m) for m in CORE_MODE_CHOICES} == set(CLASSIFIER_CORE_MODES)


def test_adaponder_checkpoints_become_ponderlm_cores():
    assert classifier_core_mode("adaponder") == "ponderlm"
    for mode in ("vanilla", "ponderlm", "loop", "pause", "typo"):
        assert classifier_core_mode(mode) == mode  # validated where the core is built


def test_attn_implementations_match_the_checkpoint_copy():
    """configuration_adaponder.py ships alone in checkpoints and keeps its own tuple; the two must not drift."""
    assert ATTN_IMPLEMENTATIONS == configuration_adaponder.ATTN_IMPLEMENTATIONS


@pytest.mark.integration
def test_import_is_light():
    code = "import sys, adaponder.core_modes; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
