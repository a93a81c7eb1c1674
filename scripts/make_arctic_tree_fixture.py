"""Writes tests/interop/fixtures/arctic_sim_tree.csv: arctic-inference's suffix-decoding simulator
(``process_task``, version 0.3) run with ``use_tree_spec=True`` on six small repetitive token
sequences, so the suffix tree branches. Needs pandas, which the simulator imports and svt does not
depend on:  pip install --target /tmp/pd pandas && PYTHONPATH=/tmp/pd python scripts/make_arctic_tree_fixture.py
"""
import numpy as np
import pandas as pd
from arctic_inference.suffix_decoding.simulator import process_task

# repetitive token sequences, as agent / code outputs are, so the suffix tree branches
rng = np.random.default_rng(0)
base = [list(rng.integers(10, 60, size=12)) for _ in range(3)]
rows = []
for i in range(6):
    prompt = base[i % 3] * 2 + list(rng.integers(10, 60, size=4))
    resp = base[i % 3][:8] + list(rng.integers(10, 60, size=3)) + base[(i + 1) % 3][:6]
    rows.append({"prompt": np.array(prompt, dtype=np.int32), "response": np.array(resp, dtype=np.int32)})
ds = pd.DataFrame(rows)
recs = []
for tid, tree in enumerate([True]):
    recs += process_task(ds, None, tid, 4, 2, 0, 24, 8, 1.0, 0.1, tree, True, 0.0, "oldest", -1)
df = pd.DataFrame(recs)
df.to_csv("tests/interop/fixtures/arctic_sim_tree.csv", index=False)
