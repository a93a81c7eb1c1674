"""Typed configs loaded from YAML, validated once at the boundary, with ``--set key=value`` overrides."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

import yaml

from svt.errors import ConfigError
from svt.fileio import read_yaml

MAX_LEN = 65_536  # longest tree depth, draft or history a cache option may name


@dataclass
class CacheOptions:
    """SuffixDecoding options (arctic-inference's names where it has one)."""

    max_tree_depth: int = 24  # depth of every suffix tree (and the longest context matched)
    max_draft_len: int = 16  # max_spec_tokens: longest draft proposed
    max_spec_factor: float = 1.0  # a draft is at most max_spec_factor * match_len + max_spec_offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # stop the draft where the tree's estimated probability falls below
    max_cached_requests: int = -1  # responses kept in the global tree (-1: all; FIFO eviction)
    history: int = 8  # positions the history features look back over
    tree: bool = False  # also log arctic-inference's tree drafts (use_tree_spec) in `cache_trees`

    def validate(self) -> CacheOptions:
        if not isinstance(self.tree, bool):
            raise ConfigError(f"Expected `cache.tree` to be true or false, but got {self.tree!r}.")
        # arctic-inference takes C ints; a tree deeper than any context, or a draft longer, is a typo
        checks = ((1 <= self.max_tree_depth <= MAX_LEN, "cache.max_tree_depth", f"an integer from 1 to {MAX_LEN:,}"),
                  (1 <= self.max_draft_len <= MAX_LEN, "cache.max_draft_len", f"an integer from 1 to {MAX_LEN:,}"),
                  (self.max_spec_factor > 0, "cache.max_spec_factor", "a number > 0"),
                  (0 <= self.min_token_prob <= 1, "cache.min_token_prob", "a number in [0, 1]"),
                  (self.max_cached_requests == -1 or 1 <= self.max_cached_requests < 2**31,
                   "cache.max_cached_requests", "-1 (all) or from 1 to 2**31 - 1"),
                  (0 <= self.max_spec_offset < 2**31, "cache.max_spec_offset", "a number from 0 to 2**31"),
                  (1 <= self.history <= MAX_LEN, "cache.history", f"an integer from 1 to {MAX_LEN:,}"))
        for ok, key, expected in checks:
            if not ok:
                raise ConfigError(f"Expected `{key}` to be {expected}, but got {getattr(self, key.split('.')[1])!r}.")
        return self

    def to_dict(self) -> dict:
        return asdict(self)




@dataclass
class LogConfig:
    """Optional tables the collector writes besides drafts, steps and requests."""

    hidden: bool = False  # the drafter's last hidden state per draft row (float16)
    dists_fraction: float = 0.0  # fraction of draft positions whose top-k q and p are logged
    dists_top_k: int = 32


@dataclass
class AVConfig:
    """Live Adaptive Verification while collecting: trim drafts with a fitted lossless predictor."""

    fit: str
    costs: str
    explore: float = 0.05  # share of steps that verify every draft (uncensored labels)
    online: bool = False  # irls-online fits: learn while collecting (from the fit's initial options,
    #                       with its warm-up refits) instead of using its final coefficients
    rule: str = "convex"  # budget rule: convex (on the cost curve's convex minorant: lossless) or
    #                       engine (the document's rule on the measured curve: lossy when not convex)
    length: bool = False  # AV+length: each row stops drafting at its own causal length (the replay's
    #                       `AV+length` policy) instead of drafting K and trimming


@dataclass
class HVDConfig:
    """Live Hybrid Verified Decoding (greedy): verify the cache draft when the yield fit predicts
    more than ``tau`` accepted tokens, else the model drafter's K drafts."""

    fit: str
    tau: float


@dataclass
class TreeConfig:
    """Draft trees, one request at a time: a static shape (``widths``: the branch width at each
    depth, Medusa/SpecInfer-style; ``[1] * K`` is the chain) or EAGLE-2's dynamic growth (expand the
    ``top_m`` best nodes by path probability at each of ``depth`` levels, keep the best ``nodes``).
    ``proposals``: ``top`` (each node's most likely tokens) or ``sampled`` (i.i.d. draws from the
    drafter; static trees on sampling runs)."""

    widths: list[int] | None = None
    top_m: int | None = None
    depth: int | None = None
    nodes: int | None = None
    proposals: str = "top"
    # how the models score a tree: ``mask`` (one forward with a 4D tree attention mask), ``paths``
    # (one chain forward per root-to-leaf path, for models that cannot take such a mask), or
    # ``auto`` (paths for attention implementations that cannot, e.g. flash attention; else mask)
    attention: str = "auto"

    MAX_NODES: ClassVar[int] = 512

    @property
    def dynamic(self) -> bool:
        return self.widths is None

    @property
    def max_depth(self) -> int:
        return len(self.widths) if self.widths is not None else int(self.depth)

    def size(self) -> int:
        """The most nodes a tree of this shape holds."""
        if self.widths is not None:
            return sum(math.prod(self.widths[:d + 1]) for d in range(len(self.widths)))
        return int(self.nodes)

    def validate(self, temperature: float) -> None:
        dyn = (self.top_m, self.depth, self.nodes)
        _check((self.widths is None) != all(v is None for v in dyn) and
               (self.widths is not None or all(v is not None for v in dyn)), "tree",
               "either `widths` (a static tree) or all of `top_m`, `depth` and `nodes` (EAGLE-2 growth)",
               {k: v for k, v in vars(self).items() if v is not None and k != "proposals"})
        if self.widths is not None:
            _check(len(self.widths) >= 1 and all(w >= 1 for w in self.widths), "tree.widths",
                   "a non-empty list of integers >= 1", self.widths)
        else:
            for key, v in zip(("top_m", "depth", "nodes"), dyn, strict=True):
                _check(v >= 1, f"tree.{key}", "an integer >= 1", v)
            # each level scores top_m x top_m candidates before the rerank
            _check(self.top_m <= 64, "tree.top_m", "at most 64", self.top_m)
            grown = self.top_m + self.top_m ** 2 * (self.depth - 1)
            _check(self.nodes <= grown, "tree.nodes", f"at most the {grown} nodes top_m {self.top_m} and depth "
                   f"{self.depth} grow", self.nodes)
        _check(self.max_depth <= 64, "tree depth", "at most 64", self.max_depth)
        _check(self.size() <= self.MAX_NODES, "tree", f"a shape of at most {self.MAX_NODES} nodes", self.size())
        _check(self.proposals in ("top", "sampled"), "tree.proposals", "top or sampled", self.proposals)
        _check(self.attention in ("auto", "mask", "paths"), "tree.attention", "auto, mask or paths", self.attention)
        if self.proposals == "sampled":
            _check(not self.dynamic, "tree.proposals", "top for EAGLE-2 growth (a node kept for its own "
                   "probability is no longer an i.i.d. draw)", self.proposals)
            _check(temperature > 0, "tree.proposals", "top on greedy runs (greedy verification takes the "
                   "target's argmax; sampled children only repeat the draft's)", self.proposals)


@dataclass
class VLLMOptions:
    """`svt collect --engine vllm`: vLLM's speculative settings (the rest of the config is shared)."""

    method: str = "draft_model"  # vLLM's speculative method: draft_model, eagle, eagle3, mtp, ...
    draft_sample_method: str = "probabilistic"  # probabilistic (vLLM's draft_probs) | greedy (vLLM's default)
    max_model_len: int = 2048
    enforce_eager: bool = True
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE on a CPU build (unless already set)
    engine_args: dict = field(default_factory=dict)  # passed to vllm.LLM as they are

    def validate(self) -> None:
        _check(self.draft_sample_method in ("probabilistic", "greedy"), "vllm.draft_sample_method",
               "probabilistic or greedy", self.draft_sample_method)
        _check(self.max_model_len >= 16, "vllm.max_model_len", "an integer >= 16", self.max_model_len)
        _check(self.kv_cache_gib >= 1, "vllm.kv_cache_gib", "an integer >= 1 (GiB)", self.kv_cache_gib)
        _check(isinstance(self.engine_args, dict) and all(isinstance(k, str) for k in self.engine_args),
               "vllm.engine_args", "a mapping of vllm.LLM argument names to values", self.engine_args)
        for key in ("model", "tokenizer", "speculative_config", "seed", "max_num_seqs"):
            _check(key not in self.engine_args, f"vllm.engine_args.{key}",
                   "unset (svt sets it from the config)", self.engine_args.get(key))


@dataclass
class StandInConfig:
    """A reference run's stand-in model drafter (no model forward): its per-position conditional
    acceptance (the chance draft i is accepted when drafts 0..i-1 were), drawn with the run's seed.
    Exactly one of: ``accept`` (one rate per position, K = ``k`` of them), ``rate`` (the same at
    every position), ``from_run`` (a run's measured conditional acceptance by position)."""

    accept: list[float] | None = None
    rate: float | None = None
    from_run: str | None = None

    def validate(self, k: int) -> None:
        given = [n for n in ("accept", "rate", "from_run") if getattr(self, n) is not None]
        _check(len(given) == 1, "stand_in", "exactly one of accept, rate, from_run",
               ", ".join(given) or "none of them")
        if self.rate is not None:
            _check(0 <= self.rate <= 1, "stand_in.rate", "a number in [0, 1]", self.rate)
        if self.accept is not None:
            _check(len(self.accept) == k, "stand_in.accept", f"a list of k = {k} rates (one per draft position)",
                   self.accept)
            for i, a in enumerate(self.accept):
                _check(0 <= a <= 1, f"stand_in.accept[{i}]", "a number in [0, 1]", a)


# collection engines: name -> "module:Class", imported only when that engine runs (svt.collect.engines)
ENGINES = {"svt": "svt.collect.runner:SvtEngine", "hvd": "svt.collect.hvd_run:HvdEngine",
           "tree": "svt.collect.tree_run:TreeEngine",
           "vllm": "svt.vllm_plugin.collect:VllmEngine", "reference": "svt.collect.reference_run:ReferenceEngine"}


@dataclass
class CollectConfig:
    """What `svt collect` runs. One path rule: a relative path in a config file is read from the
    config file's folder, one given on the command line (``--set``, ``--workload``) or in a config
    built in Python from the current directory; ``builtin:NAME`` names svt's own models
    (``builtin:target``, ``builtin:draft-large``, ``builtin:draft-small``) and a bare workload name
    (``code``, ``prose``, ``structured``, ``edit``, ``toolcalls``) svt's own workloads, from any
    directory."""

    target: str  # a reference run reads only its tokenizer
    workloads: list[Any]  # names or paths, or {path: ..., turns: last | all}
    draft: str | None = None  # required except by a reference run with `stand_in` (teacher-forced otherwise)
    requests: int | None = None  # total, taken round-robin across the workloads, each row once (None: all rows)
    repeat: bool = False  # allow `requests` above the rows (rows run again: their answers are already cached)
    turns: str = "last"  # chat records: last (the last assistant turn is the reference) | all (one request per
    #                      assistant turn, its prompt the conversation so far)
    on_missing_reference: str = "skip"  # reference runs: skip (and count) rows without a reference | error
    max_new_tokens: int = 128
    k: int = 5  # max draft length
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    batch_size: int = 8
    # static: each batch of `batch_size` requests decodes until its last row ends (rows leave as they
    # finish; a resumed run is bit-identical). continuous: `batch_size` rows decode at once and a
    # finished row's slot takes the next request at the next step, as a serving engine schedules
    schedule: str = "static"
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda[:N]
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on CUDA) | float32 | bfloat16 | float16
    max_prompt_tokens: int = 512  # longer prompts keep their head (template opening, tools, system) and last tokens
    on_long_head: str = "error"  # a prompt whose head alone exceeds max_prompt_tokens: error (every such row
    #                              named) | skip (left out, counted in run.json's workload_reading)
    log: LogConfig = field(default_factory=LogConfig)
    av: AVConfig | None = None
    # SuffixDecoding cache drafts (greedy runs): `true` for the defaults, or a mapping of options
    cache: CacheOptions | None = None
    hvd: HVDConfig | None = None
    tree: TreeConfig | None = None  # draft trees instead of chains (svt's engine, one request at a time)
    vllm: VLLMOptions = field(default_factory=VLLMOptions)  # used by `svt collect --engine vllm` only
    engine: str = "svt"  # svt | vllm | reference (no target forward: each prompt's reference is the output)
    stand_in: StandInConfig | None = None  # reference runs: a stand-in drafter instead of `draft`

    def validate(self) -> CollectConfig:
        _check(self.requests is None or self.requests >= 1, "requests", "an integer >= 1 (or unset: all rows)",
               self.requests)
        _check(self.turns in ("last", "all"), "turns", "last or all", self.turns)
        _check(self.on_missing_reference in ("skip", "error"), "on_missing_reference", "skip or error",
               self.on_missing_reference)
        _check(self.on_long_head in ("skip", "error"), "on_long_head", "skip or error", self.on_long_head)
        for i, w in enumerate(self.workloads):
            _check_workload_entry(w, f"workloads[{i}]")
        _check(self.max_new_tokens >= 1, "max_new_tokens", "an integer >= 1", self.max_new_tokens)
        _check(0 <= self.k <= 64, "k", "an integer in [0, 64] (0: plain decoding through svt's engine)", self.k)
        _check(self.schedule in ("static", "continuous"), "schedule", "static or continuous", self.schedule)
        if self.k == 0:
            _check(self.engine == "svt" and all(x is None for x in (self.av, self.cache, self.hvd, self.tree)),
                   "k", "at least 1 for a run with av, cache, hvd, tree or another engine (k = 0 is plain "
                   "decoding: nothing is drafted)", self.k)
            _check(not self.log.hidden and self.log.dists_fraction == 0, "log", "without hidden states or "
                   "distributions when k = 0 (nothing is drafted)", "set")
        if self.schedule == "continuous":  # (vLLM's own scheduler batches continuously: the key is svt's engine's)
            _check(self.engine in ("svt", "vllm") and self.hvd is None and self.tree is None, "schedule",
                   "static for live HVD (`svt cache` replays static batches' finishing order), trees and "
                   "reference runs", self.schedule)
        _check(self.temperature >= 0, "temperature", "a number >= 0 (0 = greedy)", self.temperature)
        _check(0 < self.top_p <= 1, "top_p", "a number in (0, 1]", self.top_p)
        _check(self.batch_size >= 1, "batch_size", "an integer >= 1", self.batch_size)
        _check(0 <= self.seed < 2**63, "seed", "an integer >= 0", self.seed)
        _check(self.max_prompt_tokens >= 1, "max_prompt_tokens", "an integer >= 1", self.max_prompt_tokens)
        _check(len(self.workloads) >= 1, "workloads", "a non-empty list", self.workloads)
        _check(0 <= self.log.dists_fraction <= 1, "log.dists_fraction", "a number in [0, 1]",
               self.log.dists_fraction)
        _check(self.log.dists_top_k >= 1, "log.dists_top_k", "an integer >= 1", self.log.dists_top_k)
        if self.av is not None:
            _check(0 <= self.av.explore <= 1, "av.explore", "a number in [0, 1]", self.av.explore)
            _check(self.av.rule in ("convex", "engine"), "av.rule", "convex or engine", self.av.rule)
        if self.cache is not None:
            self.cache.validate()
            _check(self.temperature == 0, "temperature", "0 (greedy) when `cache` is set: oracle yields "
                   "are defined on greedy runs", self.temperature)
            _check(self.av is None, "av", "unset when `cache` is set (cache drafts are replayed on a plain greedy "
                   "run; live AV trims the steps they are replayed on)", "set")
        self.vllm.validate()
        _check(self.engine in ENGINES, "engine", " or ".join(ENGINES), self.engine)
        _check(self.engine != "hvd" or self.hvd is not None, "hvd", "set when `engine: hvd` (its fit and tau)",
               None)
        if self.engine == "reference":
            _check(self.av is None and self.hvd is None, "av/hvd", "unset for a reference run (no target to "
                   "verify with)", "set")
            _check((self.draft is None) != (self.stand_in is None), "draft / stand_in",
                   "exactly one of them for a reference run (a real drafter teacher-forced on the reference, "
                   "or a stand-in; e.g. --set draft=null --set stand_in.rate=0.7)",
                   "both" if self.draft is not None else "neither")
            if self.stand_in is not None:
                self.stand_in.validate(self.k)
        else:
            _check(self.draft is not None, "draft", "a model directory (only a reference run may use `stand_in`)",
                   None)
            _check(self.stand_in is None, "stand_in", "unset: a stand-in drafter is for `engine: reference` runs",
                   "set")
        _check(self.engine != "tree" or self.tree is not None, "tree", "set when `engine: tree` (its shape)", None)
        if self.tree is not None:
            self.tree.validate(self.temperature)
            _check(self.engine in ("svt", "tree"), "engine", "svt when `tree` is set", self.engine)
            for key, unset in (("av", self.av), ("hvd", self.hvd), ("cache", self.cache)):
                _check(unset is None, key, "unset when `tree` is set (tree runs verify whole trees)", "set")
            _check(self.batch_size == 1, "batch_size", "1 when `tree` is set (trees are decoded one request at "
                   "a time)", self.batch_size)
            _check(not self.log.hidden and self.log.dists_fraction == 0, "log", "without hidden states or "
                   "distributions when `tree` is set (tree runs record nodes)", "set")
        if self.hvd is not None:
            _check(self.temperature == 0, "temperature", "0 (greedy) when `hvd` is set", self.temperature)
            _check(self.av is None, "av", "unset when `hvd` is set (one live policy at a time)", "set")
            _check(self.hvd.tau == self.hvd.tau, "hvd.tau", "a number (not NaN)", self.hvd.tau)
            # live HVD writes drafts, steps, requests and cache drafts, nothing else
            _check(not self.log.hidden, "log.hidden", "false when `hvd` is set (live HVD records no hidden "
                   "states)", self.log.hidden)
            _check(self.log.dists_fraction == 0, "log.dists_fraction", "0 when `hvd` is set (live HVD records no "
                   "distributions)", self.log.dists_fraction)
            _check(self.cache is None or not self.cache.tree, "cache.tree", "false when `hvd` is set (live HVD "
                   "verifies chain cache drafts; `svt evaluate --costs` replays HVD on tree cache drafts)", True)
        return self


def _check_workload_entry(w: Any, key: str) -> None:
    if isinstance(w, str):
        _check(bool(w.strip()), key, "a workload name or path", w)
        return
    _check(isinstance(w, dict) and isinstance(w.get("path"), str) and set(w) <= {"path", "turns"}, key,
           "a workload name or path, or a mapping {path: ..., turns: last | all}", w)
    _check(w.get("turns", "last") in ("last", "all"), f"{key}.turns", "last or all", w.get("turns"))


def _check(ok: bool, key: str, expected: str, got: Any) -> None:
    if not ok:
        raise ConfigError(f"Expected `{key}` to be {expected}, but got {got!r}.")


def _coerce(value: Any, typ: Any, key: str) -> Any:
    args = getattr(typ, "__args__", ())
    if type(None) in args:  # Optional[X]
        if value is None:
            return None
        typ = next(a for a in args if a is not type(None))
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, dict):
            raise ConfigError(f"Expected `{key}` to be a mapping, but got {value!r}.")
        return build_section(typ, value, prefix=f"{key}.")
    origin = getattr(typ, "__origin__", None)
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"Expected `{key}` to be a list, but got {value!r}.")
        (item,) = getattr(typ, "__args__", (str,))
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"Expected `{key}` to be true or false, but got {value!r}.")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"Expected `{key}` to be an integer, but got {value!r}.")
        return value
    if typ is float:
        if isinstance(value, str):  # YAML 1.1 reads 5e-1 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"Expected `{key}` to be a number, but got {value!r}.") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"Expected `{key}` to be a number, but got {value!r}.")
        if value != value:
            raise ConfigError(f"Expected `{key}` to be a number, but got NaN.")
        return float(value)
    if typ is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"Expected `{key}` to be a string, but got {value!r}.")
        return str(value)
    return value


def build_section(cls, data: dict[str, Any], prefix: str = ""):
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"Unknown config key `{prefix}{unknown[0]}`; valid keys: "
            f"{', '.join(prefix + n for n in sorted(names))}."
        )
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], prefix + f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"Missing required config key `{prefix}{f.name}`.")
    return cls(**kwargs)


def parse_set(items: list[str]) -> dict[str, Any]:
    """``["a=1", "log.hidden=true"]`` -> nested mapping; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"Expected `--set` as key=value, but got {item!r}.")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _merge(base: dict, over: dict) -> dict:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def load_collect_config(path: str | Path | None, overrides: dict[str, Any] | None = None,
                        base: dict[str, Any] | None = None) -> CollectConfig:
    """Load a collect config from YAML (or ``base``), apply overrides, validate."""
    data: dict[str, Any] = dict(base or {})
    if path is not None:
        path = Path(path)
        loaded = read_yaml(path, "Config file")
        if loaded is None and not base:
            raise ConfigError(f"{path}: the file is empty (or only comments); a collect config needs at least "
                              "`target`, `draft` and `workloads` (see configs/collect/demo.yaml).")
        if not isinstance(loaded or {}, dict):
            raise ConfigError(f"{path}: expected a YAML mapping at the top level.")
        data = _merge(data, loaded or {})
    data = _merge(data, absolute_paths(overrides or {}))
    if data.get("cache") is False and data.get("hvd") is not None:
        raise ConfigError("Expected `cache` to be unset, true or a mapping of options when `hvd` is set (live HVD "
                          "drafts from the cache), but got false.")
    if data.get("cache") is True:
        data["cache"] = {}
    elif data.get("cache") is False:
        data["cache"] = None
    return build_section(CollectConfig, data).validate()


BUILTIN = "builtin:"
ROOT = Path(__file__).resolve().parents[2]  # the checkout svt is installed from (data/ beside toolkit/)


def builtin_dir(kind: str) -> Path:
    """svt's shipped data: ``models`` (the tiny pair) or ``workloads``."""
    return ROOT / "data" / kind


def resolve_path(value: str, config_path: str | Path | None) -> Path:
    """The one path rule: ``builtin:NAME`` is svt's model NAME; an absolute path is itself; a
    relative one is read from the config file's folder, or from the current directory when there
    is no config file (a value given on the command line was made absolute when it was read)."""
    if str(value).startswith(BUILTIN):
        name = str(value)[len(BUILTIN):]
        path = builtin_dir("models") / name
        if not name or "/" in name or not path.is_dir():
            known = sorted(p.name for p in builtin_dir("models").iterdir() if p.is_dir())
            raise ConfigError(f"{value!r}: svt's built-in models are {', '.join(BUILTIN + k for k in known)}.")
        return path
    p = Path(value).expanduser()
    if p.is_absolute() or config_path is None:
        return p
    return Path(config_path).resolve().parent / p


PATH_KEYS = (("target",), ("draft",), ("av", "fit"), ("av", "costs"), ("hvd", "fit"), ("stand_in", "from_run"))


def _absolute(value: Any) -> Any:
    if not isinstance(value, str) or value.startswith(BUILTIN) or not value:
        return value
    return str(Path(value).expanduser().absolute())


def absolute_paths(overrides: dict[str, Any]) -> dict[str, Any]:
    """Command-line values name paths from the current directory: made absolute, so the config
    file's folder does not apply to them. Bare workload names (built-ins) stay names."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in overrides.items()}
    for keys in PATH_KEYS:
        node = out
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node.get(k), dict) else {}
        if keys[-1] in node:
            node[keys[-1]] = _absolute(node[keys[-1]])
    if "workloads" in out:
        ws = out["workloads"] if isinstance(out["workloads"], list) else [out["workloads"]]
        out["workloads"] = [_absolute(w) if isinstance(w, str) and _is_path(w) else
                            {**w, "path": _absolute(w["path"])} if isinstance(w, dict) and isinstance(w.get("path"), str)
                            and _is_path(w["path"]) else w for w in ws]
    return out


def _is_path(workload: str) -> bool:
    return workload.endswith((".jsonl", ".json", ".parquet")) or "/" in workload


def to_dict(cfg) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
