"""The typed axes of :class:`TransformerConfig`: every way the supported families differ.

The forward pass reads only these (never ``model_type``); the parsers
(:mod:`mi_transformer.config.families_llama`, ``families_gpt``, ``families_moe``) produce
them from ``config.json``.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import attrs

from mi_core.plugin import ConfigError


class NormType(enum.Enum):
    RMS = "rms"  # x / rms(x) * w
    GEMMA_RMS = "gemma_rms"  # x / rms(x) * (1 + w)
    LAYER_NORM = "layer_norm"  # (x - mean) / std * w (+ b)


class Activation(enum.Enum):
    SILU = "silu"
    GELU_TANH = "gelu_tanh"
    GELU = "gelu"
    RELU = "relu"
    RELU2 = "relu2"  # relu(x) ** 2 (Nemotron-H)
    XIELU = "xielu"  # Apertus: learned alpha_p / alpha_n / beta / eps per layer (mlp.py)


class QkvLayout(enum.Enum):
    """How a checkpoint stores the q/k/v projections (torch.nn.Linear rows unless noted)."""

    SEPARATE = "separate"  # q_proj, k_proj, v_proj
    FUSED = "fused"  # one tensor, rows [q | k | v] (Phi-3; Falcon multi-query)
    CONV1D = "conv1d"  # GPT-2 Conv1D: [d_model, q | k | v], i.e. FUSED transposed
    HEAD_INTERLEAVED = "head_interleaved"  # GPT-NeoX: rows [h0: q k v | h1: q k v | ...]
    GROUPED = "grouped"  # Falcon new decoder: per KV head [q * (h / kv) | k | v]


class MlpLayout(enum.Enum):
    GATED = "gated"  # down(act(gate(x)) * up(x))
    GATED_FUSED = "gated_fused"  # gate_up_proj, rows [gate | up]
    PLAIN = "plain"  # c_proj(act(c_fc(x)))


class Positions(enum.Enum):
    ROPE = "rope"  # rotary embedding of q and k
    LEARNED = "learned"  # a learned absolute position embedding added to the token embedding
    NONE = "none"  # no positions (state-space models: the recurrence orders the tokens)


class RopeLayout(enum.Enum):
    HALF = "half"  # GPT-NeoX / LLaMA: rotate the two halves of the rotated dims
    INTERLEAVED = "interleaved"  # GPT-J: rotate pairs of adjacent dims


class BlockLayout(enum.Enum):
    SEQUENTIAL = "sequential"  # x += attn(ln1(x)); x += mlp(ln2(x))
    PARALLEL = "parallel"  # x += attn(ln1(x)) + mlp(ln2(x))   (two norms: NeoX, Falcon-40B)
    PARALLEL_SHARED_NORM = "parallel_shared_norm"  # h = ln1(x); x += attn(h) + mlp(h)  (GPT-J)


class RopeScaling(enum.Enum):
    NONE = "default"
    LINEAR = "linear"
    LLAMA3 = "llama3"
    DYNAMIC = "dynamic"  # NTK-aware: base grows with the longest position of each call
    YARN = "yarn"  # interpolate low frequencies, keep high ones, scale cos/sin (Qwen2.5 long)
    LONGROPE = "longrope"  # per-frequency short/long factors, scale cos/sin (Phi-3 128k)


@attrs.frozen
class RopeConfig:
    """One rotary embedding: base and scaling."""

    theta: float = 10000.0
    scaling: RopeScaling = RopeScaling.NONE
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_positions: int = 8192  # llama3, yarn, longrope; dynamic (max_position_embeddings)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: round the correction range outwards
    mscale: float | None = None  # yarn: attention factor as an mscale ratio (DeepSeek style)
    mscale_all_dim: float | None = None
    attention_factor: float | None = None  # yarn/longrope: cos/sin scale (None: derived)
    short_factor: tuple[float, ...] = ()  # longrope, one per rotated frequency
    long_factor: tuple[float, ...] = ()  # longrope, once positions pass the original length

    @property
    def position_dependent(self) -> bool:
        """Whether the frequencies depend on the longest position of a call."""
        return self.scaling in (RopeScaling.DYNAMIC, RopeScaling.LONGROPE)


@attrs.frozen
class MoeConfig:
    """A mixture-of-experts MLP: softmax router, top-k gated experts (mi_transformer.moe)."""

    num_experts: int
    top_k: int
    expert_size: int  # d_mlp of each routed expert
    norm_topk_prob: bool  # renormalise the top-k weights to sum to 1 (Mixtral: always)
    shared_expert_size: int = 0  # d_mlp of the always-on shared expert; 0 = none
    shared_expert_gate: bool = False  # sigmoid(gate(x)) scales the shared expert (Qwen2-MoE)
    # checkpoint names: the block module and each expert's (gate, up, down) projections
    block: str = "mlp"
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    #: experts stored as two 3-D tensors in the block, expert_names[0] [n, 2 * d_expert,
    #: d_model] (rows [gate | up]) and expert_names[2] [n, d_model, d_expert] (Granite 4)
    fused_experts: bool = False
    #: the shared expert's module beside the block, with a fused [gate | up] expert_names[0]
    #: and expert_names[2] (Granite 4's shared_mlp); "" = block.shared_expert.{gate,up,down}_proj
    shared_module: str = ""
    # -- routing beyond softmax-top-k (mi_transformer.routing: GLM-4.5, ERNIE-4.5,
    # DeepSeek-V2/V3, Llama 4) --
    scoring: str = "softmax"  # or "sigmoid": per-expert sigmoid scores (GLM-4.5, V3, Llama 4)
    selection_bias: str = ""  # name inside the block of a bias added for choosing only
    selection_bias_rows: bool = False  # the bias stored [1, n_experts] (ERNIE's moe_statics)
    n_group: int = 1  # group-limited routing: experts in n_group groups, topk_group kept
    topk_group: int = 1
    group_by_max: bool = False  # a group scores its best expert (V2), else its best two (V3)
    routed_scaling: float = 1.0  # the routing weights multiplied by this after renormalising
    norm_min: float = 0.0  # renormalisation divides by max(sum, norm_min) (ERNIE-4.5)
    sigmoid_norm_eps: float = 1e-20  # sigmoid scores renormalise by sum + this (LFM2-MoE: 1e-6)
    shared_name: str = "shared_expert"  # the always-on expert's module ("shared_experts")
    # -- experts and routers stored or computed differently (mi_transformer.experts) --
    router_name: str = "gate"  # the router's module inside the block ("router": gpt-oss)
    router_bias: bool = False  # the router linear has a bias (gpt-oss)
    weights_scale_input: bool = False  # the routing weight scales the expert's input (Llama 4)
    fused: str = ""  # experts stored stacked [E, in, out]: "concat" (gate | up), "interleaved"
    expert_bias: bool = False  # expert projections with biases (gpt-oss)
    swiglu_limit: float | None = None  # gpt-oss clamped SwiGLU: (clamp(up) + 1) * glu(gate)
    swiglu_alpha: float = 1.702
    router_float32: bool = False  # the router computes in float32 (DeepSeek-V2, as transformers)

    def __attrs_post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ConfigError(f"MoE: num_experts_per_tok {self.top_k} must be in "
                              f"1..{self.num_experts} (the number of experts)")
        if self.num_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise ConfigError(f"MoE: n_group {self.n_group} must divide the {self.num_experts} "
                              f"experts and topk_group {self.topk_group} be in 1..n_group")
        if self.n_group > 1 and self.top_k > self.topk_group * (self.num_experts // self.n_group):
            raise ConfigError(f"MoE: num_experts_per_tok {self.top_k} exceeds the experts of "
                              f"the {self.topk_group} groups kept")

    @property
    def plain_routing(self) -> bool:
        """Softmax over all experts, top-k, optional renormalisation (mi_transformer.moe)."""
        return (self.scoring == "softmax" and not self.selection_bias and self.n_group == 1
                and self.routed_scaling == 1.0 and self.norm_min == 0.0)


#: The layer type of an attention layer in ``TransformerConfig.layer_mixers``.
ATTENTION = "attention"
#: A layer without a sequence mixer: ``x + mlp(norm(x))`` (Nemotron-H's "mlp" layers).
MLP_ONLY = "mlp"


@attrs.frozen
class MixerConfig:
    """A sequence mixer a plugin provides (``mi_core.plugin.mixer(name)``) that some layers run
    instead of attention: its spec (``MixerSpec``) and the settings it read from the config."""

    name: str  # the layer type, e.g. "mamba2"
    spec: Any = attrs.field(eq=False, repr=False)
    settings: Any = None


@attrs.frozen
class MlaConfig:
    """Multi-head latent attention (DeepSeek-V2/V3; mi_transformer.mla): q from a low-rank
    latent (or one projection), keys and values from a shared latent, each head's q/k split
    into a part without positions and a rotary part (the trailing `rope_dim` dims, the rotary
    key shared by every head), values of their own width."""

    kv_lora_rank: int
    nope_dim: int  # q/k dims without positions, per head
    rope_dim: int  # rotary q/k dims, per head (the key's are shared by the heads)
    v_head_dim: int
    q_lora_rank: int | None = None  # None: q from one projection (DeepSeek-V2-Lite)
    latent_eps: float = 1e-6  # the latent RMS norms' epsilon (transformers' default)


@attrs.frozen
class TransformerConfig:
    """The axes the generic forward pass reads. Per-layer tuples have `num_layers` entries."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    weight_names: str = "llama"  # key of mi_transformer.weights.NAME_TABLES
    norm_type: NormType = NormType.RMS
    norm_eps: float = 1e-6
    activation: Activation = Activation.SILU
    qkv_layout: QkvLayout = QkvLayout.SEPARATE
    mlp_layout: MlpLayout = MlpLayout.GATED
    block: BlockLayout = BlockLayout.SEQUENTIAL
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False  # LayerNorm with a bias
    lm_head_bias: bool = False  # GPT-J, Phi-1/2
    embedding_scale: float | None = None  # Gemma: sqrt(hidden_size)
    tie_word_embeddings: bool = False
    positions: Positions = Positions.ROPE
    position_offset: int = 0  # learned positions: row of position 0 (OPT: 2)
    rope_layout: RopeLayout = RopeLayout.HALF
    rotary_dim: int = 0  # rotated leading dims of each head (0 -> head_dim)
    ropes: tuple[RopeConfig, ...] = (RopeConfig(),)
    layer_rope: tuple[int, ...] = ()  # index into `ropes` per layer
    layer_windows: tuple[int | None, ...] = ()  # sliding window per layer (None = full)
    qk_norm: bool = False  # RMS-norm q and k per head before RoPE (Qwen3, Gemma 3)
    attn_softcap: float | None = None  # cap * tanh(scores / cap)
    final_softcap: float | None = None  # the same on the logits
    post_norms: bool = False  # norms on the attention / MLP outputs (Gemma 2/3)
    query_pre_attn_scalar: float | None = None  # scores scaled by this**-0.5 (else head_dim)
    attn_scaled: bool = True  # GPT-2 scale_attn_weights: False -> scores not scaled
    attn_scale_by_layer: bool = False  # GPT-2 scale_attn_by_inverse_layer_idx: / (layer + 1)
    max_positions: int | None = None
    # -- axes of the LLaMA-like families with twists (OLMo, OLMo2, Granite, SmolLM3, MoE) --
    qk_norm_full: bool = False  # q/k norms over the whole projection, not per head (OLMo2/OLMoE)
    clip_qkv: float | None = None  # clamp q, k, v to [-c, c] after the projections (OLMo)
    pre_norms: bool = True  # False: no norm before attention / MLP, post-norms only (OLMo2)
    norm_affine: bool = True  # False: norms without weights (OLMo's non-parametric LayerNorm)
    residual_scale: float = 1.0  # branch outputs scaled before the residual add (Granite)
    attn_multiplier: float | None = None  # scores scaled by this, not head_dim**-0.5 (Granite)
    logit_scale: float = 1.0  # logits multiplied by this (Granite: 1 / logits_scaling)
    layer_use_rope: tuple[bool, ...] = ()  # per layer, False = no positions (SmolLM3); () = all
    qk_norm_heads: bool = False  # q/k norm gains per head, [heads, d_head] (Cohere)
    moe: MoeConfig | None = None  # the mixture-of-experts MLP of the layers layer_moe marks
    layer_moe: tuple[bool, ...] = ()  # per layer, True = MoE MLP; () = all dense
    # -- mixer schedule (state-space and hybrid models, mi_transformer.mixers) --
    layer_mixers: tuple[str, ...] = ()  # per layer, ATTENTION or a mixer's name; () = all attention
    mixers: tuple[MixerConfig, ...] = ()  # the non-attention mixers layer_mixers names
    layer_mlp: tuple[bool, ...] = ()  # per layer, False = no MLP sublayer (Mamba); () = all
    residual_fp32: bool = False  # the residual stream kept in F32 (Mamba's residual_in_fp32)
    # sigmoid(gate) multiplies each head's z before W_O; q_proj rows are [q | gate] per head
    attn_output_gate: bool = False  # (Qwen3-Next, Qwen3.5 gated attention)
    mixer_pre_norms: bool = False  # mixer layers pre-norm (ln1, ln2) where attention is post-norm
    # -- axes of the 2025-26 families (config/families_recent.py, config/families_moe2.py) --
    qk_norm_after_rope: bool = False  # q/k norms applied to the rotated q/k (Hunyuan, Llama 4)
    qk_norm_affine: bool = True  # False: q/k norms without weights (Llama 4's L2 norm)
    layer_qk_norm: tuple[bool, ...] = ()  # per layer, False = no q/k norm there; () = all
    ignored_layers: tuple[int, ...] = ()  # checkpoint layers outside the forward (MTP modules)
    rope_float32: bool = False  # cos/sin kept and q/k rotated in float32 (OLMo2/3, ERNIE-4.5)
    attn_sinks: bool = False  # a learned sink logit per head joins each softmax (gpt-oss)
    layer_chunks: tuple[int | None, ...] = ()  # chunked local attention per layer (Llama 4)
    # Llama 4 on its layers without RoPE: q *= log1p(floor((pos + 1) / floor)) * scale + 1
    attn_temperature: tuple[float, float] | None = None  # (floor_scale, attn_scale)
    mla: MlaConfig | None = None  # multi-head latent attention (DeepSeek-V2/V3)
    # -- attention beside a mixer in one layer, and per-branch multipliers (Falcon-H1) --
    # per layer, True = attention AND the mixer layer_mixers names, side by side: both read
    # ln1's output, x + mixer(h) + attn(h) (mi_transformer.mixers); () = no such layer
    layer_parallel: tuple[bool, ...] = ()
    attn_in_scale: float = 1.0  # attention reads ln1's output times this (attn.hook_in)
    attn_out_scale: float = 1.0  # attention's output times this, before hook_attn_out
    mixer_in_scale: float = 1.0  # a plugin mixer reads ln1's output times this (its hook_in)
    mixer_out_scale: float = 1.0  # a plugin mixer's output times this, before hook_mixer_out
    key_scale: float = 1.0  # keys times this after their projection, before hook_k and RoPE
    mlp_gate_scale: float = 1.0  # the gate's (or c_fc's) output times this, before mlp.hook_pre
    mlp_out_scale: float = 1.0  # the MLP's output times this, before hook_mlp_out

    def __attrs_post_init__(self) -> None:
        """Relations between axes; the parsers check the same on JSON keys first, so this
        only fires for a config built by hand (or a parser bug)."""
        where = f"{self.model_type} config"
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{where}: {name} = {getattr(self, name)} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{where}: num_heads {self.num_heads} is not a multiple of "
                              f"num_kv_heads {self.num_kv_heads}")
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ConfigError(f"{where}: norm_eps = {self.norm_eps} must be > 0")
        for name, seq in (("layer_rope", self.layer_rope), ("layer_windows", self.layer_windows)):
            if len(seq) != self.num_layers:
                raise ConfigError(f"{where}: {name} has {len(seq)} entries for "
                                  f"{self.num_layers} layers")
        if any(w is not None and w < 1 for w in self.layer_windows):
            raise ConfigError(f"{where}: sliding windows {self.layer_windows} must be >= 1")
        if any(not 0 <= r < len(self.ropes) for r in self.layer_rope):
            raise ConfigError(f"{where}: layer_rope {self.layer_rope} indexes past "
                              f"{len(self.ropes)} ropes")
        if self.positions is Positions.ROPE and (
                self.rot_dim % 2 or not 0 < self.rot_dim <= self.head_dim):
            raise ConfigError(f"{where}: rotary dims {self.rot_dim} must be even and in "
                              f"1..head_dim {self.head_dim}")
        for rope in self.ropes:
            for key in ("short_factor", "long_factor"):
                n = len(getattr(rope, key))
                if rope.scaling is RopeScaling.LONGROPE and n != self.rot_dim // 2:
                    raise ConfigError(f"{where}: longrope {key} has {n} entries; the rotary "
                                      f"dimension {self.rot_dim} needs {self.rot_dim // 2}")
        for name, flags in (("layer_use_rope", self.layer_use_rope), ("layer_moe", self.layer_moe),
                            ("layer_qk_norm", self.layer_qk_norm),
                            ("layer_chunks", self.layer_chunks),
                            ("layer_mixers", self.layer_mixers), ("layer_mlp", self.layer_mlp),
                            ("layer_parallel", self.layer_parallel)):
            if flags and len(flags) != self.num_layers:
                raise ConfigError(f"{where}: {name} has {len(flags)} entries for "
                                  f"{self.num_layers} layers")
        named = {m.name for m in self.mixers}
        unknown = sorted({t for t in self.layer_mixers
                          if t not in (ATTENTION, MLP_ONLY) and t not in named})
        if unknown:
            raise ConfigError(f"{where}: layer_mixers names {unknown}, which no mixer config gives")
        lonely = [i for i, p in enumerate(self.layer_parallel) if p and self.mixer_of(i) is None]
        if lonely:
            raise ConfigError(f"{where}: layer_parallel marks layers {lonely}, whose "
                              f"layer_mixers entry names no mixer to run beside attention")
        if any(self.layer_parallel) and self.block is not BlockLayout.SEQUENTIAL:
            raise ConfigError(f"{where}: a mixer beside attention (layer_parallel) needs the "
                              f"sequential block (the MLP after both)")
        for name in ("attn_in_scale", "attn_out_scale", "mixer_in_scale", "mixer_out_scale",
                     "key_scale", "mlp_gate_scale", "mlp_out_scale"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"{where}: {name} = {getattr(self, name)} must be finite")
        if self.mlp_gate_scale != 1.0 and any(self.layer_moe):
            raise ConfigError(f"{where}: mlp_gate_scale is not implemented for "
                              f"mixture-of-experts layers")
        if any(c is not None and c < 1 for c in self.layer_chunks):
            raise ConfigError(f"{where}: attention chunks {self.layer_chunks} must be >= 1")
        if self.mla is not None and (self.num_kv_heads != self.num_heads or self.head_dim != (
                self.mla.nope_dim + self.mla.rope_dim) or self.rot_dim != self.mla.rope_dim):
            raise ConfigError(f"{where}: latent attention needs num_kv_heads == num_heads and "
                              f"head_dim == nope + rope dims (rotary dims == rope dims)")
        if any(self.layer_moe) and self.moe is None:
            raise ConfigError(f"{where}: layer_moe marks MoE layers but no MoE config is given")
        if not self.pre_norms and not self.post_norms:
            raise ConfigError(f"{where}: a block needs pre-norms or post-norms")
        if self.positions is Positions.LEARNED and self.max_positions is None:
            raise ConfigError(f"{where}: learned positions need max_positions")
        for name in ("attn_softcap", "final_softcap", "query_pre_attn_scalar", "embedding_scale"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{where}: {name} = {v} must be > 0")

    @property
    def attn_scale(self) -> float:
        if not self.attn_scaled:
            return 1.0
        if self.attn_multiplier is not None:
            return self.attn_multiplier
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def rot_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    def mixer_of(self, layer: int) -> MixerConfig | None:
        """The non-attention mixer of `layer`, or None for an attention layer."""
        name = self.layer_mixers[layer] if self.layer_mixers else ATTENTION
        return None if name in (ATTENTION, MLP_ONLY) else \
            next(m for m in self.mixers if m.name == name)

    def has_attention(self, layer: int) -> bool:
        return not self.layer_mixers or self.layer_mixers[layer] == ATTENTION or \
            self.is_parallel(layer)

    def is_parallel(self, layer: int) -> bool:
        """`layer` runs attention and its mixer side by side (``layer_parallel``)."""
        return bool(self.layer_parallel) and self.layer_parallel[layer]

    def has_mlp(self, layer: int) -> bool:
        return not self.layer_mlp or self.layer_mlp[layer]

    @property
    def v_head_dim(self) -> int:
        """Width of each head's values (and of ``hook_z``): head_dim except with MLA."""
        return self.mla.v_head_dim if self.mla is not None else self.head_dim
