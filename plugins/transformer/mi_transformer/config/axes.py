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
    # Gemma-4's full layers: the first `fraction` of the frequencies of a `dim`-wide head,
    # exponents over the whole head; the rest are 0 (those dims are not rotated)
    PROPORTIONAL = "proportional"


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
    fraction: float = 1.0  # proportional: the rotated share of the frequencies
    #: the head width this rope's tables span (0: the config's rotary width); a layer whose
    #: head size differs from the others' (Gemma-4's full layers) has a rope of its own width
    dim: int = 0

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
    shared_expert_bias: bool = False  # the shared expert's projections have biases (ERNIE)
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
    # -- Gemma-4's MoE block: beside a dense MLP, stacked experts in Linear layout --
    beside_mlp: bool = False  # the MoE runs beside the dense MLP (each post-normed, summed)
    #: stacked experts stored [E, 2 d_expert, d_model] (rows [gate | up]) / [E, d_model,
    #: d_expert] under the block, names without ``.weight`` (Gemma-4's experts.gate_up_proj)
    fused_linear: bool = False
    #: the router reads rms(x) * scale * d_model^-0.5 (a weightless RMS norm, the learned
    #: ``<router>.scale`` [d_model]) and its top-k weights are multiplied by
    #: ``<router>.per_expert_scale`` [E] after the renormalisation (Gemma-4)
    router_input_scale: bool = False
    # -- Nemotron-H's MoE layers (Nemotron 3) --
    #: False: every expert, routed and shared, is a plain MLP ``down(act(up(x)))`` (no gate
    #: projection; stacked experts ``experts.up_proj`` [E, d_expert, d_in] and
    #: ``experts.down_proj`` [E, d_in, d_expert] under the block, names without ``.weight``)
    gated: bool = True
    #: > 0: the routed experts work in a latent space of this width: ``fc1_latent_proj``
    #: (d_model -> latent) before them, ``fc2_latent_proj`` (latent -> d_model) after their
    #: weighted sum; the router and the shared expert read d_model (Nemotron-H)
    latent_size: int = 0
    #: the top-k routing weights stay float32 in a half-precision model, and each expert's
    #: weighted output and their per-token sum are float32, rounded to the model's dtype
    #: once (transformers' float32 top-k weights through its grouped_mm experts: Mixtral,
    #: MiniMax, DeepSeek-V2/V3, GLM-4.5, Nemotron-H); nothing changes in float32
    accumulate_float32: bool = False

    def __attrs_post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ConfigError(f"MoE: num_experts_per_tok {self.top_k} must be in "
                              f"1..{self.num_experts} (the number of experts)")
        if self.num_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise ConfigError(f"MoE: n_group {self.n_group} must divide the {self.num_experts} "
                              f"experts and topk_group {self.topk_group} be in 1..n_group")
        if self.latent_size < 0:
            raise ConfigError(f"MoE: moe_latent_size {self.latent_size} must be positive")
        if not self.gated and (self.fused or self.fused_experts or self.shared_module
                               or self.shared_expert_gate or self.swiglu_limit is not None):
            raise ConfigError("MoE: plain (ungated) experts are implemented per expert or "
                              "stacked as experts.up_proj / down_proj only")
        if self.n_group > 1 and self.top_k > self.topk_group * (self.num_experts // self.n_group):
            raise ConfigError(f"MoE: num_experts_per_tok {self.top_k} exceeds the experts of "
                              f"the {self.topk_group} groups kept")

    @property
    def router_module(self) -> str:
        """The router's module name inside the block ('' block: inside the layer)."""
        return f"{self.block}.{self.router_name}" if self.block else self.router_name

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
class SharedBlockConfig:
    """Shared attention blocks reused across layers (Zamba2; mi_transformer.shared_block):
    before its mixer, a layer with a use index j (``TransformerConfig.layer_shared``) runs
    weight set ``j % num_blocks`` (attention then a gated MLP, on [residual | embeddings],
    without residuals of their own) with use j's low-rank adapters (rank `adapter_rank`: on
    q / k / v where `attn_adapters`, always on the MLP's gate | up) and its own output
    projection, and adds the result to the mixer's norm input. The attention's heads and the
    MLP width are the config's (num_heads, num_kv_heads, head_dim, intermediate_size)."""

    num_blocks: int
    uses: int  # layers that run a shared block
    adapter_rank: int
    attn_adapters: bool
    mlp_bias: bool = False  # the MLP's projections have biases

    def uses_of(self, block: int) -> list[int]:
        """The use indices that run weight set `block`."""
        return [j for j in range(self.uses) if j % self.num_blocks == block]


@attrs.frozen
class PerLayerInputConfig:
    """Per-layer input embeddings (Gemma-3n, Gemma-4): a second embedding table gives each
    token one `dim`-wide vector per layer; with a projection of the token embedding it forms
    each layer's input, which gates a branch added to the residual stream after the MLP
    (``per_layer_input_gate``, ``per_layer_projection``, ``post_per_layer_input_norm``)."""

    dim: int  # hidden_size_per_layer_input
    vocab: int  # vocab_size_per_layer_input (rows of embed_tokens_per_layer)
    #: ids outside the table read row 0 (Gemma-3n); otherwise they are refused (Gemma-4,
    #: whose transformers code would index past the table)
    clip_ids: bool = False


@attrs.frozen
class AltUpConfig:
    """AltUp (Gemma-3n): `num_inputs` residual streams; each layer predicts them all from a
    learned mix, runs the block on the `active` one and corrects the others with the
    innovation (mi_transformer.altup)."""

    num_inputs: int
    active: int = 0
    correct_scale: bool = True  # the corrected active stream times correct_output_scale feeds PLE
    #: |coefficient| bound transformers applies while training only (read, not applied at
    #: inference, as transformers)
    coef_clip: float | None = None


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
    # -- MiniMax's residual arithmetic (model._block, mixers.mixer_block) --
    #: each sublayer's residual is its norm's output, not its input: x = alpha * norm(x) +
    #: beta * f(norm(x)), for the mixer / attention and for the MLP (MiniMax)
    norm_residual: bool = False
    #: per layer (alpha_mixer, beta_mixer, alpha_mlp, beta_mlp): alpha multiplies the
    #: residual, beta the branch before it is added (so before hook_attn_out / hook_mixer_out /
    #: hook_mlp_out, which stay what the branch adds); () = all 1
    layer_residual_scales: tuple[tuple[float, float, float, float], ...] = ()
    # -- a shared attention block reused across layers (Zamba2, mi_transformer.shared_block) --
    shared_block: SharedBlockConfig | None = None
    #: per layer, the use index of the shared block run before its mixer (None: none); () = none
    layer_shared: tuple[int | None, ...] = ()
    # -- axes of Gemma-4 and Gemma-3n (config/families_gemma.py) --
    layer_head_dim: tuple[int, ...] = ()  # per layer head size; () = head_dim everywhere
    layer_kv_heads: tuple[int, ...] = ()  # per layer KV heads; () = num_kv_heads everywhere
    #: per layer, the layer whose keys and values its attention reads: itself, or an earlier
    #: layer whose (cached) keys and values it shares (no k/v projections of its own); () = own
    layer_kv_source: tuple[int, ...] = ()
    layer_k_eq_v: tuple[bool, ...] = ()  # per layer, values = the key projection (pre-norm)
    v_norm: bool = False  # values RMS-normed per head without a gain (Gemma-3n, Gemma-4)
    #: RMS norms of a half-precision input multiply by their gain in float32 and round once
    #: (transformers' Gemma-3n / Gemma-4 norms, ``(norm(x.float()) * w.float()).type_as(x)``),
    #: not round, then multiply in the model's dtype (Llama's); a LayerNorm runs in float32
    #: and rounds once (OLMo's); a no-op in float32
    norm_gain_float32: bool = False
    #: the decoder's and final norms' gains loaded in float32 in a float16 model (transformers'
    #: ``_keep_in_fp32_modules``, which it applies to float16 only, not bfloat16: gpt-oss);
    #: with norm_gain_float32 their outputs keep the model's dtype
    norm_weights_float32: bool = False
    layer_mlp_size: tuple[int, ...] = ()  # per layer MLP width; () = intermediate_size
    layer_scalar: bool = False  # each layer's output multiplied by its checkpoint scalar
    per_layer_input: PerLayerInputConfig | None = None  # per-layer input embeddings
    #: per layer, Gemma-3n's activation sparsity: the gate pre-activations below mean + std *
    #: Phi^-1(p) are cut (relu(x - cutoff)) before the activation; 0 = dense; () = all dense
    layer_sparsity: tuple[float, ...] = ()
    laurel_rank: int = 0  # Gemma-3n's low-rank residual block beside attention (0: none)
    altup: AltUpConfig | None = None  # several residual streams (Gemma-3n)
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
        self._check_gemma_axes(where)
        for name, flags in (("layer_use_rope", self.layer_use_rope), ("layer_moe", self.layer_moe),
                            ("layer_qk_norm", self.layer_qk_norm),
                            ("layer_chunks", self.layer_chunks),
                            ("layer_mixers", self.layer_mixers), ("layer_mlp", self.layer_mlp),
                            ("layer_residual_scales", self.layer_residual_scales),
                            ("layer_shared", self.layer_shared),
                            ("layer_parallel", self.layer_parallel)):
            if flags and len(flags) != self.num_layers:
                raise ConfigError(f"{where}: {name} has {len(flags)} entries for "
                                  f"{self.num_layers} layers")
        self._check_mixer_axes(where)
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

    def _check_mixer_axes(self, where: str) -> None:
        """The hybrid axes: mixers named, mixers beside attention, branch multipliers,
        MiniMax's residual arithmetic and Zamba2's shared-block uses."""
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
        if (self.norm_residual or self.layer_residual_scales) and (
                self.block is not BlockLayout.SEQUENTIAL or self.norm_residual and (
                    not self.pre_norms or self.post_norms)):
            raise ConfigError(f"{where}: norm_residual / layer_residual_scales need a sequential "
                              f"block (norm_residual: with pre-norms only)")
        uses = [j for j in self.layer_shared if j is not None]
        if uses and (self.shared_block is None or uses != list(range(self.shared_block.uses))
                     or any(j is not None and self.mixer_of(i) is None
                            for i, j in enumerate(self.layer_shared))):
            raise ConfigError(f"{where}: layer_shared {self.layer_shared} must number the "
                              f"shared block's uses 0, 1, ... in order, on mixer layers")

    def _check_gemma_axes(self, where: str) -> None:
        """The per-layer geometry and sharing axes (Gemma-4, Gemma-3n)."""
        n = self.num_layers
        for name in ("layer_head_dim", "layer_kv_heads", "layer_kv_source", "layer_k_eq_v",
                     "layer_mlp_size", "layer_sparsity"):
            seq = getattr(self, name)
            if seq and len(seq) != n:
                raise ConfigError(f"{where}: {name} has {len(seq)} entries for {n} layers")
        if any(v < 1 for v in self.layer_head_dim + self.layer_kv_heads + self.layer_mlp_size):
            raise ConfigError(f"{where}: per-layer sizes must be >= 1")
        for i in range(n):
            if self.num_heads % self.kv_heads_of(i):
                raise ConfigError(f"{where}: layer {i}'s {self.kv_heads_of(i)} KV heads do not "
                                  f"divide the {self.num_heads} heads")
            src = self.kv_source_of(i)
            if not 0 <= src <= i or self.kv_source_of(src) != src or (
                    self.head_dim_of(src), self.kv_heads_of(src), self.layer_windows[src]
                    if self.layer_windows else None) != (
                    self.head_dim_of(i), self.kv_heads_of(i),
                    self.layer_windows[i] if self.layer_windows else None):
                raise ConfigError(f"{where}: layer {i} shares the keys and values of layer "
                                  f"{src}, which must be an earlier layer with its own, of the "
                                  f"same head size, KV heads and window")
        if any(not 0 <= p < 1 for p in self.layer_sparsity):
            raise ConfigError(f"{where}: activation sparsity {self.layer_sparsity} must be in "
                              f"[0, 1)")
        if self.altup is not None and not 0 <= self.altup.active < self.altup.num_inputs:
            raise ConfigError(f"{where}: altup_active_idx {self.altup.active} must be in "
                              f"0..{self.altup.num_inputs - 1}")
        if self.laurel_rank < 0:
            raise ConfigError(f"{where}: laurel_rank {self.laurel_rank} must be >= 0")
        for rope in self.ropes:
            if rope.dim % 2 or rope.dim < 0:
                raise ConfigError(f"{where}: a rope's width {rope.dim} must be even")
        for i, r in enumerate(self.layer_rope):
            if self.positions is Positions.ROPE and \
                    self.rope_dim_of(self.ropes[r]) > self.head_dim_of(i):
                raise ConfigError(f"{where}: layer {i}'s rope spans "
                                  f"{self.rope_dim_of(self.ropes[r])} dims, more than its head "
                                  f"size {self.head_dim_of(i)}")

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dim[layer] if self.layer_head_dim else self.head_dim

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads

    def mlp_size_of(self, layer: int) -> int:
        return self.layer_mlp_size[layer] if self.layer_mlp_size else self.intermediate_size

    def kv_source_of(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends with (itself unless shared)."""
        return self.layer_kv_source[layer] if self.layer_kv_source else layer

    def shares_kv(self, layer: int) -> bool:
        return self.kv_source_of(layer) != layer

    def k_eq_v_of(self, layer: int) -> bool:
        return bool(self.layer_k_eq_v) and self.layer_k_eq_v[layer]

    def rope_dim_of(self, rope: RopeConfig) -> int:
        """The width of `rope`'s cos / sin tables."""
        return rope.dim or self.rot_dim

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

    def residual_not_a_sum(self) -> str:
        """Why the final residual is not the embedding plus the layers' attention / MLP (or
        mixer) outputs ("" when it is): the ResidualTerms capability the decompositions read."""
        rescaled = self.norm_residual or any(
            s[0] != 1 or s[2] != 1 for s in self.layer_residual_scales)
        return "; ".join(why for flag, why in (
            (self.altup is not None, "the residual stream is a stack of AltUp streams that every "
             "layer predicts and corrects (hook_resid_pre / post carry one of them)"),
            (self.laurel_rank > 0, "a Laurel block adds to the residual beside attention, and the "
             "sum is divided by sqrt(2)"),
            (self.per_layer_input is not None, "each layer adds a per-layer-input branch after "
             "its MLP (hook_per_layer_out)"),
            (self.layer_scalar, "each layer's output is multiplied by its layer_scalar"),
            (rescaled, ("each sublayer's residual is its norm's output" if self.norm_residual
                        else "each sublayer's residual is scaled")
             + " (x = alpha * norm(x) + beta * f(norm(x)))")) if flag)

    def heads_not_a_sum(self) -> str:
        """Why per-head results z @ W_O do not sum to hook_attn_out ("" when they do): the
        HeadTerms capability per-head attribution reads."""
        if self.post_norms:
            return ("a norm on the attention output (post-norm) acts on the heads' sum before "
                    "hook_attn_out, so no head's result is a term of it")
        if self.residual_scale != 1.0:
            return (f"hook_attn_out is the attention output times the residual multiplier "
                    f"{self.residual_scale}")
        return ""

    def residual_scales(self, layer: int) -> tuple[float, float, float, float] | None:
        """(alpha_mixer, beta_mixer, alpha_mlp, beta_mlp) of `layer`, None when all are 1."""
        if not self.layer_residual_scales or self.layer_residual_scales[layer] == (1, 1, 1, 1):
            return None
        return self.layer_residual_scales[layer]

    def shared_set(self, layer: int) -> int | None:
        """The shared block's weight set `layer` runs (None: no shared block there)."""
        j = self.layer_shared[layer] if self.layer_shared else None
        return None if j is None or self.shared_block is None else \
            j % self.shared_block.num_blocks

    def shared_owner(self, layer: int) -> int | None:
        """The first layer that runs `layer`'s weight set (whose checkpoint module holds the
        set's tensors, as transformers saves them)."""
        block = self.shared_set(layer)
        return None if block is None else next(
            i for i in range(self.num_layers) if self.shared_set(i) == block)

    @property
    def v_head_dim(self) -> int:
        """Width of each head's values (and of ``hook_z``): head_dim except with MLA."""
        return self.mla.v_head_dim if self.mla is not None else self.head_dim
