"""The probing plugin's error: bad data for a probe (counts, classes, values)."""

from __future__ import annotations

from mi_core.plugin import MIError


class ProbingError(MIError, ValueError):
    """A labelled dataset or probe request that cannot give a meaningful result.

    Examples: one class only, prompts and labels of different counts, a malformed
    JSONL line, too few examples per class for the requested cross-validation.
    Hook points a model lacks raise :class:`mi_core.HookError` instead.
    """
