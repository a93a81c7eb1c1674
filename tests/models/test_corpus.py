"""The built-in pair's training corpus: the held-out files (the workloads' source) never reach it,
and the task documents are in exactly the workloads' formats, so the target learns the tasks it is
asked to do."""

import ast

import numpy as np
import pytest

from svt.models.corpus import is_held_out, split_files, stdlib_files
from svt.models.workloads import (
    _offsets,
    edit_prompts,
    task_documents,
    toolcall_logs,
    toolcall_prompts,
)

SOURCE = '''
TABLE = {
    "a": 1,
    "b": 2,
    "c": 3,
    "d": 4,
    "e": 5,
    "f": 6,
}


def first(values, scale):
    total = 0
    for value in values:
        total += value * scale
    if total > 100:
        total = 100
    elif total < -100:
        total = -100
    else:
        total = total * 2 + scale - scale
    return total + len(values) + scale + sum(value for value in values) + max(values) + min(values)


def second(a):
    return a


def third(a):
    return a


def fourth(a):
    return a


def fifth(a):
    return a


def sixth(a):
    return a


def seventh(a):
    return a
'''


def _name(held_out: bool) -> str:
    return next(f"pkg/m{i}.py" for i in range(1000) if is_held_out(f"pkg/m{i}.py") == held_out)


def test_the_training_split_never_holds_a_held_out_file():
    sample = stdlib_files()[:60]
    train, held = split_files(held_out=False, files=sample), split_files(held_out=True, files=sample)
    assert train and held
    assert not any(is_held_out(rel) for rel, _, _ in train)
    assert all(is_held_out(rel) for rel, _, _ in held)
    assert not {rel for rel, _, _ in train} & {rel for rel, _, _ in held}
    assert len(train) + len(held) >= 55  # every readable file lands in one split


def test_task_documents_refuse_a_held_out_file():
    with pytest.raises(ValueError, match="held-out"):
        task_documents([(_name(held_out=True), SOURCE, ast.parse(SOURCE))])


def test_task_documents_are_the_workloads_formats_written_out_in_full():
    rel = _name(held_out=False)
    tree = ast.parse(SOURCE)
    docs = task_documents([(rel, SOURCE, tree)])
    # edit: the workload's prompt followed by its whole reference revision
    (edit,) = edit_prompts(SOURCE, tree, rel, _offsets(SOURCE))
    assert edit["prompt"] + edit["reference"] in docs["edit"]
    # toolcalls: a workload prompt is a prefix of the log, and the log continues with the reference
    (prompt,) = toolcall_prompts(SOURCE, tree, rel, _offsets(SOURCE))
    (log,) = toolcall_logs(tree, rel)
    assert docs["toolcalls"] == [log]
    assert log.startswith(prompt["prompt"])
    assert log[len(prompt["prompt"]):] == prompt["reference"]
    # structured: the table, as written
    assert any(d.startswith("TABLE = {\n") and d.rstrip().endswith("}") for d in docs["structured"])


def test_methods_are_dedented_into_edit_documents():
    src = "class K:\n" + "".join("    " + line if line.strip() else line
                                 for line in SOURCE.split("def first")[1].split("def second")[0].join(["def first", ""]).splitlines(True))
    tree = ast.parse(src)
    assert edit_prompts(src, tree, "x.py", _offsets(src)) == []  # the workloads take module-level functions only
    (doc,) = edit_prompts(src, tree, "x.py", _offsets(src), methods=True)
    assert doc["prompt"].startswith("def first(values, scale):\n    total = 0\n")


def test_the_training_stream_keeps_every_document_whole_and_counts_its_sources():
    from tokenizers import Tokenizer, models, pre_tokenizers

    from svt.models.train_tiny import EOS, training_stream

    vocab = {EOS: 0, **{chr(c): c - 96 for c in range(97, 123)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    texts, tasks = ["abc", "de"], {"edit": ["fgh"], "toolcalls": ["ij", "k"]}
    stream, composition = training_stream(tok, texts, tasks, seed=3)
    assert composition == {"stdlib": 7, "edit": 4, "toolcalls": 5}
    pieces = "".join(" " if i == 0 else chr(i + 96) for i in stream.tolist()).split()
    assert sorted(pieces) == ["abc", "de", "fgh", "ij", "k"]
    again, _ = training_stream(tok, texts, tasks, seed=3)
    assert np.array_equal(stream, again)

