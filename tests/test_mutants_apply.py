"""`make mutate`'s planted bugs still apply to the code: each snippet is found exactly once in its
file and each named test file exists (a refactor that moves code must move its mutants too)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_mutant_applies():
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "mutate.py"), "--check"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "mutants apply" in res.stdout
