"""Build the API reference (HTML, from the docstrings, with pdoc) into docs/api/.

    python scripts/api_docs.py [OUT_DIR]        # default: docs/api (not committed)

The reference is built on demand, not committed: it is generated from the code, so a copy in
git could only go stale. tests/core/test_core_api_docs.py builds it on every test run and
checks that the public API (MIModel, HookSpec, HookCache, the interventions, every analysis)
is in it with its signature. Open OUT_DIR/index.html in a browser; nothing is fetched.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from pathlib import Path

#: The packages documented: the core and its rings, the command line and the built-in plugins
#: (those that are installed).
PACKAGES = ("mi_core", "mi_cli", "mi_transformer", "mi_rwkv", "mi_ssm", "mi_sae", "mi_clt",
            "mi_probing")


def modules() -> list[str]:
    """Every importable public module of PACKAGES (names with a leading underscore skipped):
    pdoc documents only what a package's ``__all__`` names unless its submodules are listed."""
    out = []
    for name in PACKAGES:
        try:
            pkg = importlib.import_module(name)
        except ImportError:
            continue
        out.append(name)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{name}."):
            if any(part.startswith("_") for part in info.name.split(".")):
                continue
            out.append(info.name)
    return out


def build(out_dir: str | Path) -> Path:
    """Write the HTML reference to `out_dir`; returns the path of its index.html."""
    import pdoc
    import pdoc.render

    out = Path(out_dir)
    pdoc.render.configure(docformat="restructuredtext", search=True, show_source=False)
    with warnings.catch_warnings():
        # pdoc warns when a listed submodule was already reached through its package, and
        # about annotations it cannot evaluate (argparse's private _SubParsersAction)
        warnings.simplefilter("ignore", UserWarning)
        pdoc.pdoc(*modules(), output_directory=out)
    return out / "index.html"


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parents[1] / "docs" / "api")
    print(f"wrote {build(target)}")
