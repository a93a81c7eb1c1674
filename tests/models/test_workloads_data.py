"""The shipped workloads: well-formed, distinct, and built only from files the models never saw."""

import json
from pathlib import Path

import pytest

from svt.collect.workloads import interleave, read_workload
from svt.models.train_tiny import is_held_out

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("code", "prose", "structured", "edit", "toolcalls")


@pytest.mark.parametrize("name", NAMES)
def test_shipped_workload_is_held_out_and_well_formed(name):
    path = ROOT / "data" / "workloads" / f"{name}.jsonl"
    prompts = read_workload(path)
    assert len(prompts) >= 40
    for line in path.read_text().splitlines():
        src = json.loads(line)["source"].rsplit(":", 1)[0]
        assert is_held_out(src), f"{src} was in the training split"


def test_interleave_is_round_robin_each_row_once():
    a = read_workload(ROOT / "data" / "workloads" / "code.jsonl")[:3]
    b = read_workload(ROOT / "data" / "workloads" / "prose.jsonl")[:1]
    assert interleave([a, b]) == [a[0], b[0], a[1], a[2]]  # prose ran out: it leaves the rotation
    assert interleave([a, b], 3) == [a[0], b[0], a[1]]


def test_requests_above_the_rows_is_refused_unless_repeat():
    """A repeated row's answer is already in the suffix cache's global tree: silently repeating rows
    inflated the cache's yield (7.4 to 10.2 on one real set)."""
    from svt.errors import ConfigError

    a = read_workload(ROOT / "data" / "workloads" / "code.jsonl")[:2]
    b = read_workload(ROOT / "data" / "workloads" / "prose.jsonl")[:1]
    with pytest.raises(ConfigError, match=r"`requests` is 4, but the workloads hold 3 prompts \(code 2, prose 1\)"):
        interleave([a, b], 4)
    got = interleave([a, b], 5, repeat=True)
    assert got == [a[0], b[0], a[1], a[0], b[0]]


@pytest.mark.parametrize("name", NAMES)
def test_shipped_references_follow_their_prompts(name):
    """Each built-in prompt carries the text that really follows it: the file text after the window
    (checked against the standard-library file itself), the rest of the revised function, or the log's
    next calls with the module's real names."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    rows = [json.loads(line) for line in (ROOT / "data" / "workloads" / f"{name}.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["reference"].strip()
        rel = row["source"].rsplit(":", 1)[0]
        if name in ("code", "prose", "structured"):
            path = root / rel
            if path.is_file():  # another Python's standard library may differ: checked where it is the same
                text = path.read_text(encoding="utf-8")
                if row["prompt"] in text:
                    assert row["prompt"] + row["reference"] in text
        elif name == "edit":
            head, ref = row["prompt"].rsplit("nothing else changes.\n", 1)[1], row["reference"]
            assert (head + ref).count("\n") >= 4 and (head + ref).startswith("def ")
        else:
            module = row["prompt"].split("`")[1]
            assert row["prompt"].endswith("))\n")
            for line in row["reference"].splitlines():
                assert line.startswith(f'calls.append(tool("read_function", module="{module}", name="')


@pytest.mark.parametrize("name", NAMES)
def test_shipped_prompts_end_on_a_token_boundary(name, models_dir):
    """The prompt's tokens followed by the reference's are the tokens of the whole text: no prompt
    ends inside a token (the prompt-boundary problem: `module=` before `"`)."""
    from svt.models.loading import load_tokenizer

    tok = load_tokenizer(models_dir / "target")
    rows = [json.loads(line) for line in (ROOT / "data" / "workloads" / f"{name}.jsonl").read_text().splitlines()]
    for row in rows:
        whole = tok(row["prompt"] + row["reference"])["input_ids"]
        assert tok(row["prompt"])["input_ids"] + tok(row["reference"])["input_ids"] == whole, row["source"]


def test_token_aligned_moves_a_cut_back_to_a_pre_token_boundary():
    from svt.models.workloads import token_aligned

    row = token_aligned({"prompt": 'x(module=', "reference": '"a.b", line=3)\n', "source": "s"})
    assert (row["prompt"], row["reference"]) == ("x(module", '="a.b", line=3)\n')
    row = token_aligned({"prompt": "def f(a):\n", "reference": "    return a\n"})
    assert (row["prompt"], row["reference"]) == ("def f(a):", "\n    return a\n")
    row = token_aligned({"prompt": "one two", "reference": " three"})  # already on a boundary
    assert (row["prompt"], row["reference"]) == ("one two", " three")


def test_the_builder_reproduces_the_shipped_workloads(tmp_path):
    """`make workloads` rebuilds data/workloads byte for byte (prompts and references) on the Python
    the files were made with; another standard library gives other windows."""
    import platform

    from svt.models.workloads import build

    if platform.python_version() != "3.11.7":
        pytest.skip("the shipped workloads come from CPython 3.11.7's standard library")
    build(tmp_path, only=["code", "edit", "toolcalls"])
    for name in ("code", "edit", "toolcalls"):
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (ROOT / "data" / "workloads" / f"{name}.jsonl").read_bytes()
