"""Reading the small JSON/YAML files users pass (fits, cost tables, configs, reports): one clear
ConfigError for a missing or unparsable file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from svt.errors import ConfigError


def read_json(path: str | Path, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} not found.")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc}).") from None


def read_yaml(path: str | Path, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {str(path)!r} not found.")
    try:
        return yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}).") from None
