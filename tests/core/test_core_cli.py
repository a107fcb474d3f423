"""`mi` follows ordinary CLI conventions: --help, exit codes, errors on stderr, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mi_cli.main import main

MI = str(Path(sys.executable).parent / "mi")


def test_help_lists_core_and_plugin_commands(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "plugins" in out and "check" in out


def test_plugins_lists_distributions_versions_and_capabilities(capsys) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "toy  (mi-toy-backend 0.1.0)" in out and "backend toy" in out
    assert "rwkv  (mi-rwkv 0.1.0)" in out


def test_check_exit_code_says_whether_the_checkpoint_is_supported(toy_dir: Path, tmp_path: Path,
                                                                  capsys) -> None:
    assert main(["check", str(toy_dir)]) == 0
    assert "supported by toy" in capsys.readouterr().out
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "banana"}))
    assert main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "NOT supported" in out
    assert out.splitlines()[0] == "no installed plugin implements model_type 'banana'"


def test_user_errors_go_to_stderr_without_traceback_and_exit_nonzero() -> None:
    out = subprocess.run([MI, "check", "./no/such/dir"], capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("mi: error: ") and "Traceback" not in out.stderr


def test_unknown_subcommand_is_a_usage_error() -> None:
    out = subprocess.run([MI, "no-such-command"], capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_no_subcommand_prints_help_and_exits_2(capsys) -> None:
    assert main([]) == 2
    assert "usage: mi" in capsys.readouterr().out
