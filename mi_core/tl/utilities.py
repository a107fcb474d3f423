"""TransformerLens 3's ``transformer_lens.utilities``: the same functions as
:mod:`mi_core.tl.utils` (``import mi_core.tl.utilities as utils`` ports unchanged)."""

from mi_core.tl.utils import *  # noqa: F401,F403
from mi_core.tl.utils import __all__  # noqa: F401
