"""The recurrent core: configuration, model, KV alignment/cache, presets, checkpoint conversion."""

from transformers import AutoConfig, AutoModelForCausalLM

from .configuration_adaponder import AdaPonderConfig, AdaPonderConfigError
from .modeling_adaponder import AdaPonderCausalLMOutput, AdaPonderForCausalLM, GateWarmup, PonderGate, ponder_loss
from .ponder_cache import KVAligner, PonderCache
from .presets import PYTHIA_SHAPES, pythia_config, pythia_shape

# Auto-class registration: in-process ``AutoModelForCausalLM`` works, and ``save_pretrained`` writes
# ``auto_map`` plus these modeling files so that ``trust_remote_code=True`` works without adaponder.
AutoConfig.register("adaponder", AdaPonderConfig, exist_ok=True)
AutoModelForCausalLM.register(AdaPonderConfig, AdaPonderForCausalLM, exist_ok=True)
AdaPonderConfig.register_for_auto_class()
AdaPonderForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "AdaPonderConfig", "AdaPonderConfigError", "AdaPonderForCausalLM", "AdaPonderCausalLMOutput", "GateWarmup",
    "PonderGate",
    "ponder_loss", "PonderCache", "KVAligner", "PYTHIA_SHAPES", "pythia_config", "pythia_shape",
]
