"""Parsers of the state-space families: Mamba, Falcon-Mamba, Mamba-2.

Each layer is ``x + mixer(norm(x))`` (no attention, no MLP), the mixer a plugin's
(``mi_core.plugin.mixer(name)``, mi-ssm registers "mamba" and "mamba2"): this module reads
the block's keys and hands the mixer's keys, named by the family's table below, to the
mixer's own reader, so a family is this parser plus its key table and a weight-name table
(mi_transformer.weights.NAME_TABLES). A hybrid family is the same with a per-layer schedule
in ``layer_mixers`` (attention where its config says so) and ``layer_mlp``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mi_core.plugin import ConfigError, UnsupportedModelError, mixer

from mi_transformer.config.axes import MixerConfig, Positions, TransformerConfig
from mi_transformer.config.neutral import Derived
from mi_transformer.config.reader import ConfigReader

#: Mixer setting -> this family's config key (the mixer reads them; mi_ssm.settings).
MAMBA_KEYS: dict[str, str] = {
    "d_state": "state_size", "expand": "expand", "d_conv": "conv_kernel",
    "dt_rank": "time_step_rank", "conv_bias": "use_conv_bias", "proj_bias": "use_bias",
    "act": "hidden_act", "d_inner": "intermediate_size"}
FALCON_MAMBA_KEYS: dict[str, str] = {**MAMBA_KEYS, "bcdt_norm_eps": "mixer_rms_eps"}
MAMBA2_KEYS: dict[str, str] = {
    "d_state": "state_size", "expand": "expand", "d_conv": "conv_kernel", "n_heads": "num_heads",
    "head_dim": "head_dim", "n_groups": "n_groups", "conv_bias": "use_conv_bias",
    "proj_bias": "use_bias", "act": "hidden_act", "norm_eps": "layer_norm_epsilon",
    "dt_limit": "time_step_limit"}

#: Keys of these configs that only initialise or train (or pick a kernel): no eval number
#: depends on them.
SSM_HARMLESS = frozenset({
    "time_step_scale", "time_step_min", "time_step_max", "time_step_init_scheme",
    "time_step_floor", "rescale_prenorm_residual", "use_mambapy", "use_falcon_mambapy",
    "use_associative_scan", "chunk_size", "fused_add_norm", "pad_vocab_size_multiple"})


def _ssm(r: ConfigReader, model_type: str, mixer_name: str, keys: Mapping[str, str],
         heads: Callable[[ConfigReader, int, Any], tuple[int, int]], tie_default: bool
         ) -> TransformerConfig:
    """Every layer: RMS norm, then the mixer; the residual stream in F32 where
    ``residual_in_fp32`` (the default) says so. `heads(r, hidden, settings)`: (heads, head_dim) of the
    mixer, what ``model.num_heads`` and effective attention count."""
    hidden, n = r.int("hidden_size"), r.int("num_hidden_layers")
    try:
        spec = mixer(mixer_name, f"{r.src}: model_type {model_type!r}")
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{exc}; the state-space mixers come with mi-ssm (pip "
                                    f"install 'mi-core[ssm]')") from None
    settings = spec.settings(r, keys, hidden)
    _leftovers(r, hidden, n)
    h, hd = heads(r, hidden, settings)
    return TransformerConfig(
        model_type=model_type, vocab_size=r.int("vocab_size"), hidden_size=hidden, num_layers=n,
        num_heads=h, num_kv_heads=h, head_dim=hd, intermediate_size=h * hd,
        weight_names="mamba", norm_eps=r.float("layer_norm_epsilon", 1e-5, gt=0),
        tie_word_embeddings=r.bool("tie_word_embeddings", tie_default),
        positions=Positions.NONE, layer_rope=(0,) * n, layer_windows=(None,) * n,
        layer_mixers=(mixer_name,) * n, mixers=(MixerConfig(mixer_name, spec, settings),),
        layer_mlp=(False,) * n, residual_fp32=r.bool("residual_in_fp32", True))


def _leftovers(r: ConfigReader, hidden: int, layers: int) -> None:
    """Keys the hub's converted Mamba configs keep from mamba_ssm's own config: accepted
    where they repeat what is read (n_layer, d_model), say what is implemented (rms_norm
    true, an empty ssm_cfg), or only pick a kernel / pad the vocabulary at creation."""
    for key, value in (("n_layer", layers), ("d_model", hidden)):
        if r.has(key) and r.int(key) != value:
            raise ConfigError(f"{r.src}: {key} = {r.get(key)!r} disagrees with {value} (read "
                              f"from num_hidden_layers / hidden_size)")
    r.refuse_unless("rms_norm", True, "the block norms are RMS norms")
    cfg = r.mapping("ssm_cfg")
    if cfg:
        raise ConfigError(f"{r.src}: ssm_cfg = {cfg!r} is not supported (the mixer's settings "
                          f"are read from the top-level keys); only an empty ssm_cfg is")


def _channels(r: ConfigReader, hidden: int, settings: Any) -> tuple[int, int]:
    """Mamba-1: every d_inner channel (the mixer's width: intermediate_size where given, as
    transformers reads it) is a head of head_dim 1 (its own decays)."""
    return settings.d_inner, 1


def parse_mamba(r: ConfigReader) -> TransformerConfig:
    return _ssm(r, "mamba", "mamba", MAMBA_KEYS, _channels, tie_default=True)


def parse_falcon_mamba(r: ConfigReader) -> TransformerConfig:
    return _ssm(r, "falcon_mamba", "mamba", FALCON_MAMBA_KEYS, _channels, tie_default=True)


def parse_mamba2(r: ConfigReader) -> TransformerConfig:
    return _ssm(r, "mamba2", "mamba2", MAMBA2_KEYS,
                lambda r, hidden, s: (r.int("num_heads"), r.int("head_dim")), tie_default=False)


#: mamba_ssm's own name for the mixer's inner width, kept by the hub's converted Mamba
#: configs (state-spaces/mamba-*-hf: ``d_inner`` beside ``intermediate_size``): transformers
#: never reads it, so it is neutral where it names the width the mixer uses. Mamba-2's
#: ``intermediate_size`` likewise: transformers' Mamba2 takes expand * hidden_size and never
#: reads it (Mamba-Codestral publishes it at that value).
D_INNER = Derived("the mixer's inner width", lambda c: c.mixers[0].settings.d_inner)
MAMBA_NEUTRAL: dict[str, Any] = {"d_inner": D_INNER}
MAMBA2_NEUTRAL: dict[str, Any] = {"intermediate_size": D_INNER}
#: Keys of published Mamba-2 configs transformers' Mamba2 does not read: ``norm_before_gate``
#: (its gated norm always gates first, whatever the key says; Mamba-Codestral publishes
#: ``true``), ``time_step_rank`` (Mamba-2 has no dt projection rank).
MAMBA2_HARMLESS = frozenset({"norm_before_gate", "time_step_rank"})

#: Config keys each family reads (the block's and the mixer's).
_SSM_BLOCK = {"vocab_size", "hidden_size", "num_hidden_layers", "layer_norm_epsilon",
              "tie_word_embeddings", "residual_in_fp32", "n_layer", "d_model", "rms_norm",
              "ssm_cfg"}
MAMBA_READS = frozenset(_SSM_BLOCK | set(MAMBA_KEYS.values()))
FALCON_MAMBA_READS = frozenset(_SSM_BLOCK | set(FALCON_MAMBA_KEYS.values()))
MAMBA2_READS = frozenset(_SSM_BLOCK | set(MAMBA2_KEYS.values()))
