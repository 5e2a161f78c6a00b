import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow   # the script asks the CLI for each shell's script in a subprocess
def test_completions_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_completions.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_completion_scripts_exist_for_three_shells():
    names = sorted(p.name for p in (ROOT / "completions").iterdir())
    assert names == ["_rlctl", "rlctl.bash", "rlctl.fish"]
    assert "complete" in (ROOT / "completions" / "rlctl.bash").read_text()
