"""The analysis layer: knockout and ablation, steering, logit lens, activation patching,
residual decomposition / direct logit attribution, static circuits and head detection,
recurrent feedback, what a layer attends with (softmax or effective attention). Everything
speaks only to MIModel, HookSpec and HookCache, so it works
for any backend that provides the hook points an analysis needs (a HookError names the
first missing one)."""

from mi_core.interp._common import MetricError
from mi_core.interp import act_patching  # TransformerLens' patching functions (mi_core.tl.patching)
from mi_core.tl.factored_matrix import FactoredMatrix
from mi_core.interp.attention import display_weights, effective_attention_point, layer_attention
from mi_core.interp.circuits import (
    CompositionScores, HeadDetectionResult, composition_scores, detect_heads,
    detection_pattern, head_scores, ov_circuit, qk_circuit, repeated_random_tokens,
)
from mi_core.interp.decomposition import (
    LogitAttribution, accumulated_resid, apply_ln_to_stack, decompose_resid,
    decomposition_points, direct_logit_attribution, logit_attrs, run_for_decomposition,
    stack_head_results,
)
from mi_core.interp.effects import EffectSummary, TokenEffect, effect_summary, token_effects
from mi_core.interp.knockout import (
    AblationResult, ChangedToken, KnockoutSpec, ablation_result, create_knockout_mask,
    kl_divergence, knockout_hooks, mean_ablation_hooks, resample_ablation_hooks, run_knockout,
    run_with_ablation,
)
from mi_core.interp.logit_lens import (
    LayerPrediction, LogitLensAnalysis, LogitLensResult, TokenPrediction,
)
from mi_core.interp.lens_grid import LogitLensGrid, logit_lens_grid
from mi_core.interp.patching import (
    PatchingResult, attribution_patching, logit_diff_metric, normalize_metric, patching_grid,
)
from mi_core.interp.recurrent import (
    RecurrentFeedbackEntry, RecurrentPassSpec, forward_recurrent, generate_recurrent,
)
from mi_core.interp.state import (
    StateAblationResult, StateSteeringResult, run_state_knockout, run_state_steering,
)
from mi_core.interp.steering import (
    DoseResponseCurve, DoseResponsePoint, SteeringCalibration, SteeringResult, SteeringSpec,
    apply_steering, contrastive_steering_vector, dose_response, steering_hooks,
)

__all__ = [
    "AblationResult", "ChangedToken", "CompositionScores", "DoseResponseCurve",
    "DoseResponsePoint", "EffectSummary", "FactoredMatrix", "HeadDetectionResult", "KnockoutSpec",
    "LayerPrediction", "LogitAttribution", "LogitLensGrid", "logit_lens_grid", "LogitLensAnalysis",
    "LogitLensResult",
    "MetricError", "PatchingResult", "RecurrentFeedbackEntry", "RecurrentPassSpec",
    "StateAblationResult", "StateSteeringResult", "SteeringCalibration", "SteeringResult",
    "SteeringSpec", "TokenEffect", "TokenPrediction", "run_state_knockout", "run_state_steering",
    "ablation_result", "accumulated_resid", "apply_ln_to_stack", "apply_steering",
    "attribution_patching", "composition_scores", "contrastive_steering_vector",
    "create_knockout_mask", "decompose_resid", "decomposition_points", "detect_heads",
    "detection_pattern", "direct_logit_attribution", "display_weights", "dose_response",
    "effect_summary", "effective_attention_point",
    "forward_recurrent", "generate_recurrent", "head_scores", "kl_divergence", "knockout_hooks",
    "layer_attention",
    "logit_attrs",
    "logit_diff_metric", "mean_ablation_hooks", "normalize_metric", "ov_circuit",
    "patching_grid", "qk_circuit", "repeated_random_tokens", "resample_ablation_hooks",
    "run_for_decomposition", "run_knockout", "run_with_ablation", "stack_head_results",
    "steering_hooks", "token_effects",
]
