"""Build the shipped workloads from held-out standard-library files (never seen in training).

    python -m svt.models.workloads --out data/workloads

Three prompt sets of clearly different predictability, each prompt cut at a point where the model
must continue in that register:

- ``code``: a function's signature (and docstring, if any) plus its first body statement; the
  model continues the body;
- ``prose``: text up to a few words into a docstring of at least 120 characters, or into a run
  of ``#`` comment lines; the model continues English prose;
- ``structured``: a large literal (dict/list/tuple/set of >= 6 elements, or a run of >= 5
  similar assignments) cut after its first few elements; the model continues a repetitive table;
- ``edit`` (agentic): a function in full, then its revision with one local name renamed, cut after
  the revision's first two lines; the model rewrites the function (a suffix cache's best case, with
  state-dependent differences where the name appears);
- ``toolcalls`` (agentic): an agent log of tool calls of one shape whose arguments are the module's
  real function names and line numbers, cut after a whole call; the model writes the next.

Every cut is moved back to a token boundary (``token_aligned``). Every prompt carries up to 1,500 characters of the file before the cut as context, and its
``reference``: what really follows the cut (the file's next ``REFERENCE_CHARS`` characters for the
three text workloads, the rest of the revised function for ``edit``, the next calls of the same log,
with the module's real names and lines, for ``toolcalls``). A reference run
(``svt collect --engine reference``) uses it as the output a strong model would have written.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import textwrap
from pathlib import Path

from svt.models.corpus import is_held_out, split_files

CONTEXT_CHARS = 1500
REFERENCE_CHARS = 1200  # more than max_new_tokens (128) tokens of the built-in tokenizer
NEXT_CALLS = 8  # calls of a toolcalls reference after the one the prompt starts
PER_WORKLOAD = 150
PER_AGENTIC = 60  # edit and toolcalls (what `make workloads` ships)
LOG_CALLS = 16  # calls per agent session in the toolcalls training documents


def _offsets(text: str) -> list[int]:
    starts, pos = [], 0
    for line in text.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    starts.append(pos)
    return starts


def _cut(text: str, at: int, src: str) -> dict:
    return {"prompt": text[max(0, at - CONTEXT_CHARS) : at], "reference": text[at : at + REFERENCE_CHARS],
            "source": src}


def code_prompts(text: str, tree: ast.AST, rel: str, offs: list[int]) -> list[dict]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 3:
            continue
        body = node.body
        first = 1 if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) else 0
        if first + 1 >= len(body):
            continue
        stmt = body[first]
        end = offs[stmt.end_lineno - 1] + stmt.end_col_offset if stmt.end_lineno else None
        if end is None:
            continue
        # include the newline and the indentation of the next statement
        nxt = body[first + 1]
        at = offs[nxt.lineno - 1] + nxt.col_offset
        out.append(_cut(text, at, f"{rel}:{node.lineno}"))
    return out


def prose_prompts(text: str, tree: ast.AST, rel: str, offs: list[int]) -> list[dict]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef, ast.Module)):
            continue
        doc = ast.get_docstring(node, clean=False)
        if not doc or len(doc) < 120 or not node.body:
            continue
        expr = node.body[0]
        start = offs[expr.lineno - 1] + expr.col_offset
        raw = text[start : start + 8]
        quote = 3 if raw[:3] in ('"""', "'''") else (4 if raw[1:4] in ('"""', "'''") else None)
        if quote is None:
            continue
        words = list(re.finditer(r"\S+", text[start + quote : start + quote + 200]))
        if len(words) < 6:
            continue
        at = start + quote + words[4].end()
        out.append(_cut(text, at, f"{rel}:{expr.lineno}"))
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):  # runs of >= 4 comment lines
        j = i
        while j < len(lines) and lines[j].lstrip().startswith("# "):
            j += 1
        if j - i >= 4:
            words = list(re.finditer(r"\S+", lines[i + 1]))
            if len(words) >= 5:
                at = offs[i + 1] + words[3].end()
                out.append(_cut(text, at, f"{rel}:{i + 2}"))
        i = max(j, i + 1)
    return out


def structured_prompts(text: str, tree: ast.AST, rel: str, offs: list[int]) -> list[dict]:
    out = []
    for node in ast.walk(tree):
        elts = None
        if isinstance(node, ast.Dict):
            elts = node.values
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            elts = node.elts
        if not elts or len(elts) < 6 or node.lineno == node.end_lineno:
            continue
        e = elts[2]
        if e.end_lineno is None:
            continue
        at = offs[e.end_lineno - 1] + e.end_col_offset
        out.append(_cut(text, at, f"{rel}:{node.lineno}"))
    body = getattr(tree, "body", [])
    run: list[ast.stmt] = []
    for stmt in [*body, None]:  # runs of >= 5 consecutive module-level constant assignments
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
            run.append(stmt)
            continue
        if len(run) >= 5:
            s = run[2]
            out.append(_cut(text, offs[s.end_lineno - 1] + s.end_col_offset, f"{rel}:{run[0].lineno}"))
        run = []
    return out


RENAMES = ("item", "value", "entry", "node", "obj", "target", "result", "data", "key", "name")


def edit_prompts(text: str, tree: ast.AST, rel: str, offs: list[int], methods: bool = False) -> list[dict]:
    """An edit workflow: a function in full, then the request to write it again with one local
    name renamed, and the revision's first lines. The continuation mostly repeats the function
    (what a suffix cache can draft) but differs wherever the renamed name appears. The workloads
    use module-level functions; ``methods=True`` (training documents) also takes methods, dedented."""
    out = []
    lines = text.splitlines(keepends=True)
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.end_lineno is None or (node.col_offset != 0 and not methods):
            continue
        src = "".join(lines[node.lineno - 1 : node.end_lineno])
        if node.col_offset:  # a method (training documents only)
            src = textwrap.dedent(src)
        if not 250 <= len(src) <= 900 or len(node.body) < 3:
            continue
        names = {}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and len(sub.id) >= 3 and sub.id not in ("self", "None", "True", "False"):
                names[sub.id] = names.get(sub.id, 0) + 1
        for a in node.args.args:
            if a.arg != "self" and len(a.arg) >= 3:
                names[a.arg] = names.get(a.arg, 0) + 1
        used = sorted((n for n, c in names.items() if c >= 3 and re.fullmatch(r"[a-z_][a-z0-9_]*", n)), key=str)
        if not used:
            continue
        old = used[len(node.name) % len(used)]  # deterministic (str hash() is salted per process)
        new = next(r for r in RENAMES if r not in names and r != old)
        revised = re.sub(rf"\b{re.escape(old)}\b", new, src)
        revised_lines = revised.splitlines(keepends=True)
        head = "".join(revised_lines[:2])
        prompt = (f"{src}\n\n# The same function after a refactor: `{old}` is renamed to `{new}`; "
                  f"nothing else changes.\n{head}")
        out.append({"prompt": prompt, "reference": "".join(revised_lines[2:]), "source": f"{rel}:{node.lineno}"})
    return out


def _call(module: str, name: str, line: int) -> str:
    return f'calls.append(tool("read_function", module="{module}", name="{name}", line={line}))\n'


def toolcall_prompts(text: str, tree: ast.AST, rel: str, offs: list[int]) -> list[dict]:
    """A multi-turn agent log: tool calls of one fixed shape with state-dependent arguments (the
    module's real function names and line numbers), cut where the next call starts. The cache sees
    the repeated structure; the arguments are what it gets wrong. The prompt ends with a line; the
    model writes the next call."""
    funcs = sorted((n.lineno, n.name) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    if len(funcs) < 6:
        return []
    out = []
    module = rel.removesuffix(".py").replace("/", ".")
    for start in range(0, len(funcs) - 5, 6):
        chunk = funcs[start : start + 6]
        calls = "".join(_call(module, name, line) for line, name in chunk[:-1])
        prompt = f"# Agent session: reading `{module}` one function at a time.\ncalls = []\n{calls}"
        # the reference: the next call, then the log's calls after it (the module's following
        # functions, in line order)
        nxt = funcs[start + 5 : start + 6 + NEXT_CALLS]
        reference = "".join(_call(module, n, ln) for ln, n in nxt)
        out.append({"prompt": prompt, "reference": reference, "source": f"{rel}:{chunk[0][0]}"})
    return out


def toolcall_logs(tree: ast.AST, rel: str) -> list[str]:
    """Whole agent logs in the ``toolcalls`` format (training documents): the module's functions in
    line order, ``LOG_CALLS`` calls per session."""
    funcs = sorted((n.lineno, n.name) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    module = rel.removesuffix(".py").replace("/", ".")
    out = []
    for start in range(0, len(funcs), LOG_CALLS):
        chunk = funcs[start : start + LOG_CALLS]
        if len(chunk) < 6:
            continue
        out.append(f"# Agent session: reading `{module}` one function at a time.\ncalls = []\n"
                   + "".join(_call(module, name, line) for line, name in chunk))
    return out


def table_documents(text: str, tree: ast.AST) -> list[str]:
    """The file's multi-line literals of >= 6 elements and runs of >= 5 module-level constant
    assignments, each as its own document (training documents: the ``structured`` register)."""
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        elts = node.values if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)) and elts and len(elts) >= 6 \
                and node.end_lineno and node.lineno != node.end_lineno:
            out.append(textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno])))
    run: list[ast.stmt] = []
    for stmt in [*getattr(tree, "body", []), None]:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
            run.append(stmt)
            continue
        if len(run) >= 5:
            out.append("".join(lines[run[0].lineno - 1 : run[-1].end_lineno]))
        run = []
    return [d for d in out if d.strip()]


def task_documents(files) -> dict[str, list[str]]:
    """Training documents in the workloads' task formats, from (relative path, text, tree) of
    training-split files: ``edit`` (the request with its whole revision, methods included),
    ``toolcalls`` (whole agent logs) and ``structured`` (the files' tables). A held-out file is an
    error: the workloads are made of those, and the models must never see them."""
    docs: dict[str, list[str]] = {"edit": [], "toolcalls": [], "structured": []}
    for rel, text, tree in files:
        if is_held_out(rel):
            raise ValueError(f"{rel} is a held-out file; task documents come from the training split only")
        if tree is None:
            continue
        offs = _offsets(text)
        docs["edit"] += [p["prompt"] + p["reference"] for p in edit_prompts(text, tree, rel, offs, methods=True)]
        docs["toolcalls"] += toolcall_logs(tree, rel)
        docs["structured"] += table_documents(text, tree)
    return docs


_PRE_TOKENIZER = None


def token_aligned(row: dict) -> dict:
    """The row with its cut moved back to the nearest boundary of a GPT-2-style byte-level
    pre-tokenizer (the built-in tokenizer's, and that of most BPE LLM tokenizers), so that the
    prompt's tokens followed by the reference's are exactly the tokens of the whole text. A cut inside
    a pre-token (``module=`` before ``"``, a newline before the next line's indentation) leaves the
    model a token sequence it never saw in training and a reference whose first tokens no model
    writes: the prompt-boundary problem."""
    global _PRE_TOKENIZER
    if _PRE_TOKENIZER is None:
        from tokenizers import pre_tokenizers

        _PRE_TOKENIZER = pre_tokenizers.ByteLevel(add_prefix_space=False)
    whole, at = row["prompt"] + row["reference"], len(row["prompt"])
    ends = [0] + [end for _, (_, end) in _PRE_TOKENIZER.pre_tokenize_str(whole[: at + 64])]
    cut = max(e for e in ends if e <= at)
    return {**row, "prompt": whole[:cut], "reference": whole[cut:]}


BUILDERS = {"code": code_prompts, "prose": prose_prompts, "structured": structured_prompts}
# agentic / edit workflows, where a suffix cache matters (Hybrid Verified Decoding)
AGENTIC = {"edit": edit_prompts, "toolcalls": toolcall_prompts}


def build(out_dir: Path, per_workload: int | None = None, seed: int = 0,
          only: list[str] | None = None) -> dict[str, int]:
    """Write the workloads; ``per_workload`` (default: 150 each, 60 for the agentic two) caps each."""
    builders = {**BUILDERS, **AGENTIC}
    if only:
        builders = {k: v for k, v in builders.items() if k in only}
    found: dict[str, list[dict]] = {k: [] for k in builders}
    for rel, text, tree in split_files(held_out=True):
        if tree is None:
            continue
        offs = _offsets(text)
        for name, fn in builders.items():
            rows = (token_aligned(p) for p in fn(text, tree, rel, offs))
            found[name].extend(p for p in rows if p["prompt"].strip() and p["reference"].strip())
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, prompts in found.items():
        rng = random.Random(f"{seed}:{name}")
        rng.shuffle(prompts)
        cap = per_workload if per_workload is not None else (PER_AGENTIC if name in AGENTIC else PER_WORKLOAD)
        chosen = prompts[:cap]
        with open(out_dir / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for p in chosen:
                fh.write(json.dumps(p, ensure_ascii=False) + "\n")
        counts[name] = len(chosen)
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("data/workloads"))
    ap.add_argument("--per-workload", type=int, default=None,
                    help=f"prompts per workload (default {PER_WORKLOAD}, {PER_AGENTIC} for edit and toolcalls)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help="build only these workloads (e.g. edit toolcalls)")
    args = ap.parse_args(argv)
    print(build(args.out, args.per_workload, args.seed, args.only))


if __name__ == "__main__":
    main()
