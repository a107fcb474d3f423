"""Moved to :mod:`mi_cli.scale`; kept as an alias."""

from mi_cli.scale import (  # noqa: F401
    ANALYSES, PROMPT_FIELDS, read_prompts, read_texts, register,
)
