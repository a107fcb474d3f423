"""``python -m mi_cli`` is ``mi``."""

import sys

from mi_cli.main import main

sys.exit(main())
