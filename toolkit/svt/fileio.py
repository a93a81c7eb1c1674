"""Reading the small JSON/YAML files users pass (fits, cost tables, configs, reports): one clear
ConfigError for a missing or unparsable file; and writing JSON that is always valid JSON."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from svt.errors import ConfigError

# JSON has no infinity or NaN: svt writes them as null and says, under this key of the document,
# what each was ({"/hvd/rows/3/tau": "-inf"}, JSON-pointer paths); read_json restores the infinities
NON_FINITE = "non_finite"


def _pointer(parts: list) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _finite(o, at: list, found: dict):
    if isinstance(o, float) and not math.isfinite(o):
        found[_pointer(at)] = "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
        return None
    if isinstance(o, dict):
        return {str(k): _finite(v, [*at, k], found) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v, [*at, i], found) for i, v in enumerate(o)]
    return o


def _parts(pointer: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def _has(doc, pointer) -> bool:
    node = doc
    for p in _parts(pointer) if isinstance(pointer, str) and pointer.startswith("/") else [None]:
        if isinstance(node, dict) and p in node:
            node = node[p]
        elif isinstance(node, list) and p is not None and p.isdigit() and int(p) < len(node):
            node = node[int(p)]
        else:
            return False
    return True


def _at(doc, pointer):
    node = doc
    for p in _parts(pointer):
        node = node[int(p)] if isinstance(node, list) else node[p]
    return node


def json_text(obj: Any, indent: int | None = 2, default=None) -> str:
    """``obj`` as valid JSON text (RFC 8259: no NaN or Infinity). A non-finite float is written as
    null; for a dict document, what it was is recorded under ``"non_finite"`` (JSON-pointer path ->
    "inf", "-inf" or "nan"), so other readers know why a value is null and read_json restores it."""
    found: dict[str, str] = {}
    if default is not None:  # objects JSON cannot hold (paths): converted first, as json.dumps would
        obj = json.loads(json.dumps(obj, default=default, allow_nan=True))
    clean = _finite(obj, [], found)
    if isinstance(clean, dict):
        # an earlier NaN mark stays while its value is still null; infinities were restored on reading
        # and are found again, and a mark whose value has since changed is dropped
        earlier = clean.pop(NON_FINITE, None)
        kept = {p: w for p, w in (earlier.items() if isinstance(earlier, dict) else ())
                if w == "nan" and _has(clean, p) and _at(clean, p) is None}
        if kept or found:
            clean[NON_FINITE] = {**kept, **found}
    return json.dumps(clean, indent=indent, allow_nan=False) + ("\n" if indent is not None else "")


def _restore(doc: Any) -> Any:
    marks = doc.get(NON_FINITE) if isinstance(doc, dict) else None
    if not isinstance(marks, dict):
        return doc
    for pointer, what in marks.items():
        if what not in ("inf", "-inf") or not isinstance(pointer, str) or not pointer.startswith("/"):
            continue  # NaN stays null: an undefined value
        parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]
        node = doc
        try:
            for p in parts[:-1]:
                node = node[int(p)] if isinstance(node, list) else node[p]
            last = int(parts[-1]) if isinstance(node, list) else parts[-1]
            if node[last] is None:
                node[last] = math.inf if what == "inf" else -math.inf
        except (KeyError, IndexError, ValueError, TypeError):
            raise ConfigError(f"{NON_FINITE}: {pointer!r} names no null value of the document.") from None
    return doc


def parse_json(text: str) -> Any:
    """``json.loads`` with svt's non-finite marks restored (ConfigError for a bad mark)."""
    return _restore(json.loads(text))


def read_json(path: str | Path, what: str) -> Any:
    """A JSON file (svt's own non-finite marks restored), or one ConfigError saying why not."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} not found.")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc}).") from None
    try:
        return _restore(doc)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives one key twice (PyYAML keeps the last one
    silently: a config or cost table with a pasted row would be read as another file)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = {}
    for key_node, _ in node.value:  # the keys written here (a `<<` merge may be overridden: not twice)
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # an unhashable key: the base constructor says so
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"found the key {key!r} twice (first {seen[key]})",
                key_node.start_mark)
        seen[key] = f"line {key_node.start_mark.line + 1}"
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml_text(text: str) -> Any:
    """``yaml.safe_load``, but a key given twice in one mapping is an error."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506  (a SafeLoader subclass)


def read_yaml(path: str | Path, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} not found.")
    try:
        return load_yaml_text(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}).") from None


@contextlib.contextmanager
def atomic_path(path: str | Path, *, fsync: bool = False) -> Iterator[Path]:
    """Write a file beside ``path`` and rename it over ``path`` only when the block ends without an
    error, so a reader sees the old file or the new one, never half of one; on an error or a
    Ctrl-C the temporary file is removed and ``path`` is untouched. Every svt writer of a single
    file goes through here (run directories use :mod:`svt.traces.rundir` for whole folders).

        with atomic_path(out / "report.json") as tmp:
            tmp.write_text(text)
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: writers never share it
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        for _ in range(2):  # a Ctrl-C that polars left pending fires at the next call: clean up once more
            try:
                tmp.unlink(missing_ok=True)
                break
            except KeyboardInterrupt:
                continue
            except OSError:
                break
        raise


@contextlib.contextmanager
def output_lock(out: str | Path) -> Iterator[None]:
    """Hold ``out`` for one writer: a second svt process writing the same output is refused at once
    with one clear error (never two staging folders in one place, never one writer's data lost).
    The lock is ``flock`` on ``.NAME.svt-lock`` beside ``out``: the kernel releases it when the
    holder exits, ``kill -9`` included, so a killed writer's lock is never stale. The file is
    removed when the holder is done. An ``out`` inside a run directory is refused (a run's folders
    hold its own tables; anything else there makes the run unreadable)."""
    import fcntl

    out = Path(out)
    if out.is_symlink():  # a swap would replace the link by a folder and leave the old target beside it
        raise ConfigError(f"--out {out} is a symbolic link (to {os.readlink(out)}); pass the path it points to.")
    host = next((p for p in out.resolve().parents if (p / "run.json").is_file()), None)
    if host is not None:  # a run's folders hold its tables only: anything else breaks it
        raise ConfigError(f"--out {out} is inside the run {host}; write it outside any run directory.")
    lock = out.parent / f".{out.name}.svt-lock"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"Cannot write {out}: {exc.strerror or exc}.") from None
    while True:
        try:
            fh = open(lock, "a+")  # noqa: SIM115  (held until the block ends)
        except OSError as exc:
            raise ConfigError(f"Cannot write {out}: {exc.strerror or exc}.") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            who = fh.read().strip() or "another process"
            fh.close()
            raise ConfigError(f"{out} is being written by another svt command ({who}); wait for it to "
                              "finish, or write elsewhere.") from None
        try:  # the holder before us may have removed the file between our open and our lock
            same = os.stat(lock).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}")
    fh.flush()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()
        fh.close()


@contextlib.contextmanager
def writing(out: str | Path, check: Callable[[], Any] | None = None) -> Iterator[Any]:
    """Own ``out`` from its check to its last write: take the output lock, then run ``check`` (the
    writer's refusals: an existing output without ``--overwrite``, a folder that is not a run, an
    overlap with an input) *while holding it*, and yield what ``check`` returns. A check made before
    the lock is a race (two writers to one new ``out`` both find it empty, both write, one's result
    is lost): every writer of an output goes through here, so the order cannot be got wrong.

        with writing(out, lambda: check_fit_out(out, overwrite)):
            ...  # write out
    """
    with output_lock(out):
        yield check() if check is not None else None


def write_text_atomic(path: str | Path, text: str, *, fsync: bool = False) -> Path:
    """``path.write_text(text)``, atomically (see :func:`atomic_path`)."""
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_text(text)
    return Path(path)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (workloads, configs and weights are identified by it)."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def json_objects(path: Path, fail: Callable[[str, str], Exception] = lambda where, what: ConfigError(
        f"{where}: {what}")) -> Iterator[tuple[str, dict]]:
    """(where, object) of a JSON Lines file, or of a JSON file holding a list of objects, read as
    UTF-8; ``fail(where, what)`` makes the error for the first record that is not an object, a line
    that is not JSON, or a file that is neither form (``where``: ``file:line`` or ``file record N``)."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors write one) is not text
    except UnicodeDecodeError as exc:
        raise fail(str(path), f"not UTF-8 text (byte {exc.start}); JSON files are UTF-8.") from None
    stripped = text.lstrip()
    if stripped.startswith("{") and "\n" in stripped.strip() and not _is_json_line(stripped.split("\n", 1)[0]):
        raise fail(str(path), "expected JSON Lines (one object per line) or a JSON list of objects, but the first "
                              "line is not a whole object (a pretty-printed object?).")
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise fail(str(path), f"not valid JSON ({exc.msg} at line {exc.lineno}).") from None
        for i, obj in enumerate(data):
            where = f"{path} record {i + 1}"
            if not isinstance(obj, dict):
                raise fail(where, f"expected a JSON object, but got {type(obj).__name__}.")
            yield where, obj
        return
    # JSON Lines ends lines with \n (and \r\n) only: U+2028, U+0085 and the like are text inside strings
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise fail(where, f"not valid JSON ({exc.msg}).") from None
        if not isinstance(obj, dict):
            raise fail(where, f"expected a JSON object, but got {type(obj).__name__}.")
        yield where, obj


def _is_json_line(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False
