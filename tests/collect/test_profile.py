import numpy as np

from svt.collect.profile import profile_pair
from svt.simulate.costs import load_costs, write_costs


def test_profile_writes_a_loadable_measured_table(tiny_pair, tmp_path):
    table = profile_pair(tiny_pair.target, tiny_pair.draft, k=3, batches=(1, 4), context=32, repeats=2)
    assert sorted(table.draft_ms) == [1, 4] and sorted(table.draft_ms[1]) == [1, 2, 3]
    assert all(v > 0 for row in table.draft_ms.values() for v in row.values())
    # drafting k tokens is k sequential forwards: cumulative times grow with k
    assert table.draft_ms[4][3] > table.draft_ms[4][1]
    assert sorted(table.verify_ms) == [1, 2, 3, 4, 8, 12, 16]
    loaded = load_costs(write_costs(table, tmp_path / "c.yaml"))
    assert loaded.kind == "measured"
    assert np.isclose(loaded.draft(4, 3), table.draft_ms[4][3], rtol=1e-3)
    # the file holds the measured values (4 decimals), not a smoothed copy
    for t, ms in table.verify_ms.items():
        assert loaded.verify_ms[t] == round(ms, 4)
    assert all(v > 0 for v in table.verify_ms.values())
