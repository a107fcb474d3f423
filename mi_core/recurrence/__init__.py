"""The recurrence layer every recurrent mixer shares: ``S_t = A_t S_{t-1} + B_t``,
``y_t = C_t S_t``, in key-value layout (``S[..., i, j]``: key channel i, value channel j).

- :mod:`~mi_core.recurrence.diagonal`: a diagonal decay (per key channel, or one scalar per
  head), reading the state after (inclusive) or before (exclusive, with a bonus) the token.
- :mod:`~mi_core.recurrence.rank1`: a diagonal decay plus a rank-1 transition (delta rules).

Each has the chunked forward (``*_scan``), the exact token-by-token recurrence returning every
per-step state (``*_states``, only for a state hook) and the exact effective attention
(``*_effective_attention``: A [batch, heads, seq, seq] with ``A @ v == y``).
:func:`write_scales` / :func:`written_keys` are the one reading of the core's state specs;
:class:`Mixer` is what a plugin's :class:`mi_core.plugin.MixerSpec` builds for a backend's
generic block. A ring of mi-core: it imports the kernel through ``mi_core.plugin`` only, and
backend plugins may import it (docs/ARCHITECTURE.md).
"""

from mi_core.recurrence.diagonal import (
    chunks, decay_matrix, diagonal_effective_attention, diagonal_scan, diagonal_states, intra,
    pad_time, read_states,
)
from mi_core.recurrence.mixer import Mixer, write_scales, written_keys
from mi_core.recurrence.rank1 import (
    delta_scan, rank1_effective_attention, rank1_scan, rank1_states,
)

__all__ = [
    "Mixer", "chunks", "decay_matrix", "delta_scan", "diagonal_effective_attention",
    "diagonal_scan",
    "diagonal_states", "intra", "pad_time", "rank1_effective_attention", "rank1_scan",
    "rank1_states", "read_states", "write_scales", "written_keys",
]
