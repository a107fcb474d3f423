"""Moved to :mod:`mi_cli.analysis` (commands), :mod:`mi_cli.demo` (``mi demo``'s result),
:mod:`mi_cli.models` and :mod:`mi_cli.output`; kept as an alias."""

from mi_cli.analysis import (  # noqa: F401
    describe_knockout, format_dose, format_knockout, print_demo, register,
)
from mi_cli.demo import (  # noqa: F401
    AttentionResult, DemoResult, LensRow, TokenProb, demo, format_demo,
)
from mi_cli.models import (  # noqa: F401
    DEFAULT_PROMPT, default_model_path, load_model, model_name,
)
from mi_cli.output import console, num  # noqa: F401
