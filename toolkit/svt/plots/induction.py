"""The induction gate through the built-in pair's training (``data/models/training.json``): top-1
accuracy and cross-entropy on the repeat of random strings written twice, and the best head's
induction score, against the training tokens of every stage in turn.

    python -m svt.plots.induction data/models/training.json --out docs/induction-gate.png
"""

from __future__ import annotations

import numpy as np

from svt.errors import DataError
from svt.models.induction import GATE_CE, GATE_TOP1
from svt.plots.style import COLORS


def gate_curve(training: dict, model: str = "target"):
    """Two panels over the tokens of ``model``'s stages (boundaries dotted, the jump marked): top-1
    on the repeat and the best head's induction score; cross-entropy on the repeat and on the first
    copy (nats). The goals are dashed."""
    import matplotlib.pyplot as plt

    try:
        stages = training["models"][model]["stages"]
    except (KeyError, TypeError):
        raise DataError(f"The training record has no stages for {model!r} (made by svt.models.recipe?).") from None
    fig, (top, ce) = plt.subplots(2, 1, figsize=(7.2, 5.6), sharex=True, constrained_layout=True)
    offset = 0
    for i, st in enumerate(stages):
        c = st["curve"]
        x = (offset + np.array([p["tokens"] for p in c], dtype=float)) / 1e6
        kw = {"label": None} if i else {}
        top.plot(x, [p["top1"] for p in c], color=COLORS[0], lw=1.2, **({"label": "top-1 on the repeat"} if not i else kw))
        top.plot(x, [p.get("max_induction_score") for p in c], color=COLORS[1], lw=1.0,
                 **({"label": "best head's induction score"} if not i else kw))
        ce.plot(x, [p["cross_entropy"] for p in c], color=COLORS[0], lw=1.2, **({"label": "on the repeat"} if not i else kw))
        ce.plot(x, [p.get("first_copy_cross_entropy") for p in c], color="0.55", lw=1.0,
                **({"label": "on the first copy"} if not i else kw))
        if st.get("jump_tokens") is not None:
            top.axvline((offset + st["jump_tokens"]) / 1e6, color=COLORS[3], lw=0.8)
            top.annotate("jump", ((offset + st["jump_tokens"]) / 1e6, 0.05), color=COLORS[3], fontsize=8, xytext=(3, 0),
                         textcoords="offset points")
        offset += st["tokens"]
        for ax in (top, ce):
            ax.axvline(offset / 1e6, color="0.7", lw=0.8, ls=":")
        top.annotate(st["stage"].replace(f"{model}-", ""), ((offset - st["tokens"] / 2) / 1e6, 1.02), ha="center",
                     fontsize=8, color="0.35", annotation_clip=False)
    top.axhline(GATE_TOP1, color="0.4", lw=0.8, ls="--", label=f"goal (top-1 >= {GATE_TOP1:.0%}, CE <= {GATE_CE:g})")
    ce.axhline(GATE_CE, color="0.4", lw=0.8, ls="--")
    top.set_ylim(0, 1.08)
    top.set_ylabel("share")
    ce.set_ylabel("cross-entropy (nats)")
    ce.set_xlabel("training tokens (millions)")
    top.legend(fontsize=8, loc="center right")
    ce.legend(fontsize=8, loc="upper right")
    fig.suptitle(f"Induction gate of the built-in {model} through its training (random 30-token strings written twice)",
                 fontsize=9)
    return fig


def main(argv=None) -> None:
    import argparse
    from pathlib import Path

    from svt.errors import SvtError
    from svt.fileio import read_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("training", type=Path, help="the pair's training record (data/models/training.json)")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--model", default="target")
    args = ap.parse_args(argv)
    try:
        fig = gate_curve(read_json(args.training, "the pair's training record"), args.model)
    except SvtError as exc:
        raise SystemExit(f"error: {exc}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
