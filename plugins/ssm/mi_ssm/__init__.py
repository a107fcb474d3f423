"""mi-ssm: state-space, linear-attention and short-convolution sequence mixers (Mamba,
Mamba-2, gated DeltaNet, LFM2's gated short convolution) for the generic blocks of mi-core's
backends, on the shared recurrence layer (:mod:`mi_core.recurrence`)."""

from mi_ssm.common import POINTS, SsmState, causal_conv
from mi_ssm.mamba import MambaMixer, mamba_tensors
from mi_ssm.mamba2 import Mamba2Mixer, mamba2_tensors
from mi_ssm.settings import Mamba2Settings, MambaSettings, mamba2_settings, mamba_settings
from mi_ssm.short_conv import ConvState, ShortConvMixer, ShortConvSettings, conv_windows

__version__ = "0.1.0"

__all__ = [
    "ConvState", "Mamba2Mixer", "Mamba2Settings", "MambaMixer", "MambaSettings", "POINTS",
    "ShortConvMixer", "ShortConvSettings", "SsmState", "causal_conv", "conv_windows",
    "mamba2_settings", "mamba2_tensors", "mamba_settings", "mamba_tensors",
]
