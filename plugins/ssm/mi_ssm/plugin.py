"""Registration of mi-ssm with mi-core: the mixers generic blocks run (by layer type name)
and their hook points. mi-ssm registers no backend: the backend that owns the block (for
Mamba, Falcon-Mamba and Mamba-2, mi-transformer's generic block) finds a mixer through
``mi_core.plugin.mixer(name)``, so neither plugin imports the other."""

from __future__ import annotations

from typing import Any

from mi_core.plugin import MixerSpec, plugin_impl

from mi_ssm.common import FACTORIES
from mi_ssm.gated_delta import FACTORIES as GATED_DELTA_FACTORIES
from mi_ssm.gated_delta import (CONCATENATED, build_gated_delta, gated_delta_settings,
                                gated_delta_tensors)
from mi_ssm.lightning import build_lightning, lightning_settings, lightning_tensors
from mi_ssm.mamba import build_mamba, mamba_tensors
from mi_ssm.mamba2 import build_mamba2, mamba2_tensors
from mi_ssm.settings import mamba2_settings, mamba_settings
from mi_ssm.short_conv import FACTORIES as SHORT_CONV_FACTORIES
from mi_ssm.short_conv import build_short_conv, short_conv_settings, short_conv_tensors


@plugin_impl
def mi_register_mixers() -> list[MixerSpec]:
    return [
        MixerSpec("mamba", mamba_settings, mamba_tensors, build_mamba,
                  "Mamba-1 selective scan (per-channel decays); Falcon-Mamba's B/C/dt norms"),
        MixerSpec("mamba2", mamba2_settings, mamba2_tensors, build_mamba2,
                  "Mamba-2 state-space duality (a scalar decay per head, grouped B/C)"),
        MixerSpec("gated_deltanet", gated_delta_settings, gated_delta_tensors, build_gated_delta,
                  "gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): a gated delta rule",
                  concatenated=CONCATENATED),
        MixerSpec("lightning_attention", lightning_settings, lightning_tensors, build_lightning,
                  "lightning attention (MiniMax): linear attention with a decay per head"),
        MixerSpec("short_conv", short_conv_settings, short_conv_tensors, build_short_conv,
                  "gated short convolution (LFM2): out_proj(C * causal_conv(B * x))"),
    ]


@plugin_impl
def mi_declare_hook_points() -> dict[str, str]:
    """``HookPoint.ssm_state(i)`` == ``blocks.{i}.ssm.hook_state``, and the other ssm points."""
    return {**FACTORIES, **GATED_DELTA_FACTORIES, **SHORT_CONV_FACTORIES}


@plugin_impl
def mi_opt_in_hook_points() -> list[str]:
    """Per-step states ([b, s, heads, head_dim, d_state]) and effective attention ([b, heads,
    s, s]; Mamba-1's heads are its d_inner channels) are large: a default run_with_cache
    leaves them out (hook them by name)."""
    return ["ssm.hook_state", "ssm.hook_effective_attn", "attn.hook_state",
            "attn.hook_effective_attn", "conv.hook_state", "conv.hook_effective_attn"]


@plugin_impl
def mi_plugin_info() -> dict[str, Any]:
    return {"provides": ["mixer mamba (Mamba, Falcon-Mamba)", "mixer mamba2 (Mamba-2)",
                          "mixer gated_deltanet (Qwen3-Next, Qwen3.5)",
                          "mixer lightning_attention (MiniMax)",
                          "mixer short_conv (LFM2)"]}
