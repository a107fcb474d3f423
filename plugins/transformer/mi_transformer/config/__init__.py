"""`TransformerConfig`: every way the supported decoder-only families differ, as typed axes.

A family is a parser from its ``config.json`` to these axes plus the list of keys it reads
(:class:`Family`, registered in :data:`FAMILIES`); the forward pass only ever reads the axes.
Parsing is strict (:class:`ConfigReader`): a value of the wrong JSON type or out of range is a
``ConfigError`` naming the key, the value and the file (``"false"`` is not a bool, ``2.7`` is
not an int), and a key that is neither read by the family nor known to be harmless is refused
unless it holds its *neutral value* (the one that leaves the forward unchanged, e.g.
``rope_interleaved: false`` on a rotate-half family), so no key that changes the numbers is
ever silently ignored. Both rope spellings are accepted: the hub's (``rope_theta`` /
``rope_scaling``) and the one transformers 5 writes
(``rope_parameters``, optionally nested per layer type).

Every name is importable from here; the modules, in import order (none imports a later one):

- :mod:`~mi_transformer.config.axes`: the axes (``TransformerConfig``, ``RopeConfig``,
  ``MoeConfig`` and the layout enums);
- :mod:`~mi_transformer.config.size`: the parameters a config implies and the checks, before
  anything is allocated, that they fit in memory (``ConfigTooLarge``);
- :mod:`~mi_transformer.config.reader`: ``ConfigReader`` and ``UnknownKeysError``;
- :mod:`~mi_transformer.config.neutral`: the value-aware key policy (``Derived``, the
  shared neutral tables, ``policy_violations``);
- :mod:`~mi_transformer.config.common`: helpers shared by the parsers (RoPE, heads,
  ``_base``, ``_finish``);
- :mod:`~mi_transformer.config.families_llama`, :mod:`~mi_transformer.config.families_gpt`,
  :mod:`~mi_transformer.config.families_moe`, :mod:`~mi_transformer.config.families_recent`,
  :mod:`~mi_transformer.config.families_moe2` (gpt-oss, DeepSeek-V2/V3, Llama 4),
  :mod:`~mi_transformer.config.families_gemma` (Gemma-4, Gemma-3n),
  :mod:`~mi_transformer.config.families_ssm`, :mod:`~mi_transformer.config.families_linear`:
  one ``parse_<family>`` per family (families_recent also ``REFUSED``: families refused by
  name; the state-space and linear-attention ones run a plugin's mixer);
- :mod:`~mi_transformer.config.registry`: ``Family`` and ``FAMILIES`` (parser + keys read +
  keys known to be harmless + neutral values of keys not read);
- :mod:`~mi_transformer.config.auto`: ``parse_config`` and ``auto_config``.
"""

from mi_transformer.config.auto import AUTO_FAMILY, auto_config, parse_config
from mi_transformer.config.axes import (
    ATTENTION, MLP_ONLY, Activation, BlockLayout, MixerConfig, MlaConfig, MlpLayout, MoeConfig,
    NormType, Positions, QkvLayout, RopeConfig, RopeLayout, RopeScaling, SharedBlockConfig,
    TransformerConfig,
)
from mi_transformer.config.axes import AltUpConfig, PerLayerInputConfig
from mi_transformer.config.families_gemma import (
    parse_gemma3n, parse_gemma3n_text, parse_gemma4, parse_gemma4_text,
)
from mi_transformer.config.families_gpt import (
    parse_falcon, parse_gpt2, parse_gpt_neox, parse_gptj, parse_opt, parse_phi, parse_stablelm,
)
from mi_transformer.config.families_llama import (
    parse_cohere, parse_gemma, parse_gemma2, parse_gemma3, parse_gemma3_text, parse_granite,
    parse_helium, parse_llama, parse_mistral, parse_olmo, parse_olmo2, parse_phi3, parse_qwen2,
    parse_qwen3, parse_smollm3, parse_starcoder2,
)
from mi_transformer.config.families_moe import (
    parse_mixtral, parse_olmoe, parse_qwen2_moe, parse_qwen3_moe,
)
from mi_transformer.config.families_moe2 import (
    parse_deepseek_v2, parse_deepseek_v3, parse_gpt_oss, parse_llama4, parse_llama4_text,
)
from mi_transformer.config.families_recent import (
    REFUSED, parse_apertus, parse_ernie4_5, parse_ernie4_5_moe, parse_exaone4, parse_glm,
    parse_glm4, parse_glm4_moe, parse_hunyuan_v1_dense, parse_olmo3, parse_seed_oss,
)
from mi_transformer.config.families_ssm import parse_falcon_mamba, parse_mamba, parse_mamba2
from mi_transformer.config.neutral import ROTARY, ROTARY_DIM, ROTARY_INTERLEAVED, Derived
from mi_transformer.config.reader import ConfigReader, UnknownKeysError
from mi_transformer.config.registry import FAMILIES, FAMILY_PARSERS, Family, family_parsers

__all__ = [
    "ATTENTION", "AUTO_FAMILY", "Activation", "AltUpConfig", "MLP_ONLY", "PerLayerInputConfig",
    "parse_gemma3n", "parse_gemma3n_text", "parse_gemma4", "parse_gemma4_text", "BlockLayout", "ConfigReader", "Derived",
    "FAMILIES", "FAMILY_PARSERS", "Family", "MixerConfig", "MlaConfig", "MlpLayout",
    "MoeConfig", "NormType", "Positions", "QkvLayout", "REFUSED", "ROTARY", "ROTARY_DIM",
    "ROTARY_INTERLEAVED", "RopeConfig", "RopeLayout", "RopeScaling", "SharedBlockConfig",
    "TransformerConfig",
    "UnknownKeysError", "auto_config", "family_parsers", "parse_apertus", "parse_cohere",
    "parse_config", "parse_deepseek_v2", "parse_deepseek_v3", "parse_ernie4_5",
    "parse_ernie4_5_moe", "parse_exaone4", "parse_falcon", "parse_falcon_mamba", "parse_gemma",
    "parse_gemma2", "parse_gemma3", "parse_gemma3_text", "parse_glm", "parse_glm4",
    "parse_glm4_moe", "parse_gpt2", "parse_gpt_neox", "parse_gpt_oss", "parse_gptj",
    "parse_granite", "parse_helium", "parse_hunyuan_v1_dense", "parse_llama", "parse_llama4",
    "parse_llama4_text", "parse_mamba", "parse_mamba2", "parse_mistral", "parse_mixtral",
    "parse_olmo", "parse_olmo2", "parse_olmo3", "parse_olmoe", "parse_opt", "parse_phi",
    "parse_phi3", "parse_qwen2", "parse_qwen2_moe", "parse_qwen3", "parse_qwen3_moe",
    "parse_seed_oss", "parse_smollm3", "parse_stablelm", "parse_starcoder2",
]
