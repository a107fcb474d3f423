"""Packaging: one version everywhere, and `mi-core[rwkv,clt]` installs from local wheels only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import mi_core

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ["transformer", "rwkv", "ssm", "sae", "clt", "probing"]


def _project(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]


def test_every_distribution_shares_one_version_and_pins_the_matching_core() -> None:
    core = _project(ROOT)
    assert core["name"] == "mi-core" and core["version"] == mi_core.__version__
    for name in PLUGINS:
        proj = _project(ROOT / "plugins" / name)
        assert proj["name"] == f"mi-{name}" and proj["version"] == core["version"]
        assert f"mi-core=={core['version']}" in proj["dependencies"]
        assert proj["entry-points"]["mi_core"] == {name: f"mi_{name}.plugin"}
        extra = core["optional-dependencies"][name]
        assert any(d.startswith(f"mi-{name}") and d.endswith(f"=={core['version']}") for d in extra)
    assert {"transformer", "rwkv", "ssm", "clt", "sae", "probing", "all"} <= set(
        core["optional-dependencies"])
    assert any(d.startswith("mi-ssm") for d in core["optional-dependencies"]["all"])


def _requires(wheel: Path, extras: set[str] = frozenset()) -> list[str]:
    """Requires-Dist of a wheel (extras selected), without mi-* distributions."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        req, _, marker = line[len("Requires-Dist: "):].partition(";")
        m = re.search(r"extra == ['\"]([\w-]+)['\"]", marker)
        if (m and m.group(1) not in extras) or req.strip().startswith("mi-"):
            continue
        out.append(req.strip())
    return out


@pytest.mark.slow
def test_mi_core_extras_install_from_locally_built_wheels_only(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    for src in [ROOT] + [ROOT / "plugins" / p for p in PLUGINS]:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(dist), str(src)], check=True)
    wheels = {w.name.split("-")[0]: w for w in dist.glob("*.whl")}
    assert set(wheels) == {"mi_core"} | {f"mi_{p}" for p in PLUGINS}

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # Third-party dependencies (torch first, pinned) may come from the package index ...
    deps = _requires(wheels["mi_core"]) + _requires(wheels["mi_rwkv"]) + _requires(wheels["mi_clt"])
    subprocess.run([py, "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", *deps], check=True)
    # ... but mi-core and its plugins resolve only from the wheels built above.
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(dist),
                    "mi-core[rwkv,clt]"], check=True)
    code = ("import json; from mi_core import plugins; "
            "print(json.dumps([i.name for i in plugins.plugin_infos()]))")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout
    names = json.loads(out)
    assert "rwkv" in names and "clt" in names
    assert "sae" not in names and "transformer" not in names
    listed = subprocess.run([str(venv / "bin" / "mi"), "plugins"], capture_output=True,
                            text=True, check=True).stdout
    assert "rwkv  (mi-rwkv 0.1.0)" in listed and "sae" not in listed
