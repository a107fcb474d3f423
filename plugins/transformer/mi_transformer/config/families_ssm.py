"""Parsers of the state-space families: Mamba, Falcon-Mamba, Mamba-2.

Each layer is ``x + mixer(norm(x))`` (no attention, no MLP), the mixer a plugin's
(``mi_core.plugin.mixer(name)``, mi-ssm registers "mamba" and "mamba2"): this module reads
the block's keys and hands the mixer's keys, named by the family's table below, to the
mixer's own reader, so a family is this parser plus its key table and a weight-name table
(mi_transformer.weights.NAME_TABLES). A hybrid family is the same with a per-layer schedule
in ``layer_mixers`` (attention where its config says so) and ``layer_mlp``.
"""

from __future__ import annotations

from typing import Callable, Mapping

from mi_core.plugin import ConfigError, UnsupportedModelError, mixer

from mi_transformer.config.axes import MixerConfig, Positions, TransformerConfig
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
         heads: Callable[[ConfigReader, int], tuple[int, int]], tie_default: bool
         ) -> TransformerConfig:
    """Every layer: RMS norm, then the mixer; the residual stream in F32 where
    ``residual_in_fp32`` (the default) says so. `heads(r, hidden)`: (heads, head_dim) of the
    mixer, what ``model.num_heads`` and effective attention count."""
    hidden, n = r.int("hidden_size"), r.int("num_hidden_layers")
    try:
        spec = mixer(mixer_name, f"{r.src}: model_type {model_type!r}")
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{exc}; the state-space mixers come with mi-ssm (pip "
                                    f"install 'mi-core[ssm]')") from None
    settings = spec.settings(r, keys, hidden)
    _leftovers(r, hidden, n)
    h, hd = heads(r, hidden)
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


def _channels(r: ConfigReader, hidden: int) -> tuple[int, int]:
    """Mamba-1: every d_inner channel is a head of head_dim 1 (its own decays)."""
    return r.int("expand", 2) * hidden, 1


def parse_mamba(r: ConfigReader) -> TransformerConfig:
    return _ssm(r, "mamba", "mamba", MAMBA_KEYS, _channels, tie_default=True)


def parse_falcon_mamba(r: ConfigReader) -> TransformerConfig:
    return _ssm(r, "falcon_mamba", "mamba", FALCON_MAMBA_KEYS, _channels, tie_default=True)


def parse_mamba2(r: ConfigReader) -> TransformerConfig:
    return _ssm(r, "mamba2", "mamba2", MAMBA2_KEYS,
                lambda r, hidden: (r.int("num_heads"), r.int("head_dim")), tie_default=False)


#: Config keys each family reads (the block's and the mixer's).
_SSM_BLOCK = {"vocab_size", "hidden_size", "num_hidden_layers", "layer_norm_epsilon",
              "tie_word_embeddings", "residual_in_fp32", "n_layer", "d_model", "rms_norm",
              "ssm_cfg"}
MAMBA_READS = frozenset(_SSM_BLOCK | set(MAMBA_KEYS.values()))
FALCON_MAMBA_READS = frozenset(_SSM_BLOCK | set(FALCON_MAMBA_KEYS.values()))
MAMBA2_READS = frozenset(_SSM_BLOCK | set(MAMBA2_KEYS.values()))
