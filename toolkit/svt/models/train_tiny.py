"""The pieces of the built-in tiny pair: the corpus stream, the tokenizer, the model shapes, the
plain training loop, held-out evaluation, sharpening and the swap into OUT. The recipe that makes
the committed weights from them is :mod:`svt.models.recipe` (``make models``).

- ``tokenizer``: byte-level BPE, 2048 tokens, trained on the training files;
- ``target``: a 4-layer, 256-wide Llama (transformers' own ``LlamaConfig``), trained on next tokens
  of one stream of whole documents: the training files, plus task documents built from those files
  only (``svt.models.workloads.task_documents``): edit requests followed by their whole revision,
  complete agent logs of tool calls, and the files' tables. Held-out files (the workloads' source)
  never enter the stream;
- the target is then **sharpened**: its final RMSNorm weight is multiplied by ``SHARPEN`` (all
  logits scale by that factor; the same as sampling the trained model at temperature
  1 / SHARPEN). A 4M-parameter model trained on a few million tokens is far less confident than a
  real LLM, and with such flat distributions no drafter's confidence can rank acceptance at
  temperature 1. Sharpening gives the target the confidence profile of a real one (greedy decoding
  is unchanged); its held-out loss before and after is recorded, so nobody mistakes it for a better
  language model;
- ``draft-small`` (1 layer, 128 wide) and ``draft-large`` (2 layers, 192 wide): distilled from the
  sharpened target (soft cross-entropy against its distributions), each token's loss weighted by
  the target's top-1 probability squared, so the drafters spend their small capacity on the
  contexts the target is sure of, and disagree with it where it is unsure: the pattern that makes
  real drafters' confidence informative.

Training is float32: bf16 autocast is ~20x slower than float32 on CPUs without bf16 matrix units
(measured 120 against 2,200 tokens/s on this project's 2-core machine), and float32 gives the same
weights wherever the CPU is. The corpus is every ``.py`` file of the running interpreter's
standard library outside test folders, split by a hash of the file's relative path
(``svt.models.corpus``): 1 file in 10 is held out for validation and for the workload prompts
(``python -m svt.models.workloads``). The standard library differs between Python versions, so
identical weights need the same Python (the committed ones: 3.11.7).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from svt.models.corpus import is_held_out, split_files, stdlib_files  # noqa: F401  (re-exported)
from svt.models.workloads import task_documents

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class TinySpec:
    """One model of the pair: its shape and its training budget in tokens."""

    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    train_tokens: int
    lr: float
    distil: bool
    confidence_weight: float = 0.0  # distillation loss weight = target top-1 prob ** this


TARGET = TinySpec("target", 256, 4, 4, 768, 5_600_000, 2e-3, distil=False)
DRAFTS = (
    TinySpec("draft-small", 128, 1, 2, 384, 1_000_000, 3e-3, distil=True, confidence_weight=2.0),
    TinySpec("draft-large", 192, 2, 3, 576, 2_400_000, 3e-3, distil=True, confidence_weight=2.0),
)
SHARPEN = 3.0
SEQ_LEN = 512  # prompts (<= 384 tokens) plus 128 new tokens: generation stays inside trained positions
BATCH = 8
VOCAB = 2048
SHORT_CONTEXT = 256


def read_corpus() -> tuple[list[str], list[str], dict[str, list[str]]]:
    """Training texts, held-out texts, and the task documents built from the training files."""
    train = split_files(held_out=False)
    held = split_files(held_out=True)
    return [t for _, t, _ in train], [t for _, t, _ in held], task_documents(train)


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok, texts: list[str]) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


def training_stream(tok, texts: list[str], tasks: dict[str, list[str]], seed: int) -> tuple[np.ndarray, dict]:
    """One token stream of whole documents (the files and every task document, each ending in EOS)
    in a seeded order, and how many tokens each source contributes."""
    eos = tok.token_to_id(EOS)
    docs = [("stdlib", t) for t in texts] + [(k, d) for k, v in tasks.items() for d in v]
    encoded = [np.asarray([*enc.ids, eos], dtype=np.int64) for enc in tok.encode_batch([d for _, d in docs])]
    order = np.random.default_rng(seed).permutation(len(encoded))
    composition: dict[str, int] = {}
    for (kind, _), enc in zip(docs, encoded, strict=True):
        composition[kind] = composition.get(kind, 0) + len(enc)
    stream = np.concatenate([encoded[i] for i in order]) if encoded else np.zeros(0, dtype=np.int64)
    return stream, composition


def make_model(spec: TinySpec, eos_id: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return LlamaForCausalLM(config)


def batches(stream: np.ndarray, n_steps: int, seed: int):
    rng = np.random.default_rng(seed)
    hi = len(stream) - SEQ_LEN - 1
    for _ in range(n_steps):
        starts = rng.integers(0, hi, size=BATCH)
        yield torch.from_numpy(np.stack([stream[s : s + SEQ_LEN + 1] for s in starts]))


def lr_at(step: int, n_steps: int, peak: float, warmup: int = 50) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, n_steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def evaluate(model, teacher, held: torch.Tensor) -> dict:
    """Held-out next-token loss (nats/token) and, for a student, KL(target || draft) and top-1 match."""
    model.eval()
    ce = kl = agree = 0.0
    n = 0
    ce_short = n_short = 0.0
    for chunk in held.to(next(model.parameters()).device).split(8):
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = model(input_ids=x).logits.float()
        per_token = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), reduction="none").view(y.shape)
        ce += per_token.sum().item()
        ce_short += per_token[:, :SHORT_CONTEXT].sum().item()
        n_short += per_token[:, :SHORT_CONTEXT].numel()
        if teacher is not None:
            t_logits = teacher(input_ids=x).logits.float()
            t_logp = t_logits.log_softmax(-1)
            logq = logits.log_softmax(-1)
            kl += (t_logp.exp() * (t_logp - logq)).sum().item()
            agree += (t_logits.argmax(-1) == logits.argmax(-1)).sum().item()
        n += y.numel()
    model.train()
    # the first 256 positions of each window: the protocol of the pair trained at sequence length 256
    out = {"held_out_loss": ce / n, "held_out_loss_first_256": ce_short / n_short}
    if teacher is not None:
        out["held_out_kl_to_target"] = kl / n
        out["held_out_top1_agreement"] = agree / n
    return out


def train_one(spec: TinySpec, stream, held, eos_id, seed, teacher=None, log=print, device: str = "cpu"):
    torch.manual_seed(seed)
    model = make_model(spec, eos_id).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_steps = spec.train_tokens // (BATCH * SEQ_LEN)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.1, betas=(0.9, 0.95))
    model.train()
    t0 = time.time()
    for step, batch in enumerate(batches(stream, n_steps, seed)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, n_steps, spec.lr)
        batch = batch.to(device)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):  # float32 on a CPU
            logits = model(input_ids=x).logits.float()
            if teacher is not None:
                with torch.no_grad():
                    target_probs = teacher(input_ids=x).logits.float().softmax(-1)
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        else:  # soft cross-entropy = KL(target || draft) + const, weighted by target confidence
            per_token = -(target_probs * logits.log_softmax(-1)).sum(-1)
            weight = target_probs.amax(-1) ** spec.confidence_weight
            loss = (per_token * weight).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == n_steps - 1:
            rate = (step + 1) * BATCH * SEQ_LEN / (time.time() - t0)
            log(f"[{spec.name}] step {step + 1}/{n_steps} loss {loss.item():.3f} ({rate:,.0f} tok/s)",
                flush=True)
    figures = {
        "parameters": n_params,
        "tokens_seen": n_steps * BATCH * SEQ_LEN,
        "train_seconds": round(time.time() - t0, 1),
        **{k: round(v, 4) for k, v in evaluate(model, teacher, held).items()},
    }
    log(f"[{spec.name}] {figures}", flush=True)
    return model, figures


def sharpen(model, factor: float) -> None:
    """Scale every logit by ``factor`` (the final RMSNorm weight; the LM head is tied to it)."""
    with torch.no_grad():
        model.model.norm.weight.mul_(factor)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def prepare_data(seed: int):
    """The tokenizer, the training stream, 64 held-out windows and the figures that describe them."""
    train_texts, held_texts, tasks = read_corpus()
    print(f"corpus: {len(train_texts)} training files, {len(held_texts)} held out; task documents: "
          + ", ".join(f"{len(v)} {k}" for k, v in tasks.items()), flush=True)
    tok = train_tokenizer(train_texts)  # on the files only: the same tokenizer as the workloads'
    stream, composition = training_stream(tok, train_texts, tasks, seed)
    held_stream = encode_stream(tok, held_texts)
    chars = sum(map(len, train_texts))
    files_tokens = composition["stdlib"]
    print(f"tokens: {len(stream):,} train ({composition}; {chars / files_tokens:.2f} chars/token in the files), "
          f"{len(held_stream):,} held out", flush=True)
    rng = np.random.default_rng(seed + 1)
    starts = rng.integers(0, len(held_stream) - SEQ_LEN - 1, size=64)
    held = torch.from_numpy(np.stack([held_stream[s : s + SEQ_LEN + 1] for s in starts]))
    figures = {
        "python": sysconfig.get_python_version(),
        "seed": seed,
        "seq_len": SEQ_LEN,
        "batch": BATCH,
        "precision": "float32 (saved as bf16)",
        "train_tokens_available": int(len(stream)),
        "train_tokens_by_source": composition,
        "chars_per_token": round(chars / files_tokens, 3),
        "models": {},
    }
    return tok, stream, held, figures


def save_pair(out: Path, models: dict, hf_tok, figures: dict, scaled) -> None:
    """Written beside OUT, then swapped in: an interrupted run leaves the previous pair whole."""
    stage = out.parent / f".{out.name}.svt-new"
    shutil.rmtree(stage, ignore_errors=True)
    for name, model in models.items():
        path = stage / name
        model.to(torch.bfloat16).save_pretrained(path)
        hf_tok.save_pretrained(path)
        spec = TARGET if name == "target" else next(d for d in DRAFTS if d.name == name)
        figures["models"][name]["spec"] = asdict(scaled(spec))
    (stage / "training.json").write_text(json.dumps(figures, indent=2) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    for entry in sorted(stage.iterdir()):
        dest = out / entry.name
        old = out / f".{entry.name}.svt-old"
        _remove(old)
        if dest.exists():
            dest.rename(old)
        entry.rename(dest)
        _remove(old)
    stage.rmdir()


def save_target(out: Path, model, factor: float, stage: dict, held: torch.Tensor | None = None) -> None:
    """A fine-tuned target (``model`` unsharpened, float32) written over OUT/target, sharpened by
    ``factor`` and rounded to bf16, with ``stage`` recorded in OUT/training.json; written beside
    and swapped in, so an interruption leaves the previous target whole. The drafts and heads are
    then stale: retrain them (``make models`` does, the stage being part of the recipe)."""
    model = copy.deepcopy(model).to(torch.bfloat16).float()  # the figures are the saved weights
    training = json.loads((out / "training.json").read_text())
    entry = training["models"]["target"]
    entry.setdefault("stages", [])
    entry["stages"] = [s for s in entry["stages"] if s.get("stage") != stage["stage"]] + [stage]
    entry["held_out_loss"] = stage["after"]["held_out_loss"]
    if held is not None:
        entry.update({k: round(v, 4) for k, v in evaluate(model, None, held).items()})
    sharpen(model, factor)
    if held is not None:
        entry["held_out_loss_sharpened"] = round(evaluate(model, None, held)["held_out_loss"], 4)
    entry["unlikelihood"] = {k: stage[k] for k in ("accepted", "chosen_step", "before", "after")}
    stage_dir = out.parent / f".{out.name}.svt-new-target"
    _remove(stage_dir)
    model.to(torch.bfloat16).save_pretrained(stage_dir / "target")
    for f in (out / "target").iterdir():  # the tokenizer's files as they are (a re-save would add keys)
        if f.is_file() and f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy2(f, stage_dir / "target" / f.name)
    (stage_dir / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    for name in ("target", "training.json"):
        old = out / f".{name}.svt-old"
        _remove(old)
        (out / name).rename(old)
        (stage_dir / name).rename(out / name)
        _remove(old)
    stage_dir.rmdir()
