"""benchmarks/bench_live.py refuses a malformed --variant before it profiles or collects anything."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args, words", [(["--variant", "old"], "NAME=PYTHONPATH"),
                                         (["--variant", "a=", "--variant", "a="], "distinct names"),
                                         (["--variant", "old=/no/such/toolkit"], "no such directory")])
def test_a_malformed_variant_is_one_clear_error(tmp_path, args, words):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_live.py"), *args, "--work", str(tmp_path / "w"),
                        "--out", str(tmp_path / "o.json")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "o.json").exists()
