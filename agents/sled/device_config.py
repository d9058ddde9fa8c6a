"""A device's configuration file, in the SLED seed's shape, checked key by key.

    draft_model: /models/draft-q4_0.gguf
    quantization: q4_0            # f32, f16, q8_0 or q4_0 (what draft_model holds)
    speculative_length:
      min: 3
      max: 8
      target_acceptance: 0.75
    network:
      retry_timeout: 200          # ms
      max_retries: 3

JSON or YAML (YAML needs PyYAML on the device). Every error names the file, the key and what
was expected. The file sets the adaptive draft length and the fixed retry policy; command-line
flags given explicitly win over it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QUANTIZATIONS = ("f32", "f16", "q8_0", "q4_0")
KEYS = {
    "draft_model": None,
    "quantization": None,
    "speculative_length": {"min", "max", "target_acceptance"},
    "network": {"retry_timeout", "max_retries"},
}


class DeviceConfigError(ValueError):
    """A device configuration file that does not have the expected shape."""


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DeviceConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError and yaml.YAMLError are ValueErrors here
        raise DeviceConfigError(f"{path}: not valid {path.suffix or 'JSON'}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - YAML parse errors
        raise DeviceConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise DeviceConfigError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    return data


def _number(path: Path, key: str, value: Any, kind: type, low: float, high: float) -> Any:
    ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not ok or not low <= value <= high:
        raise DeviceConfigError(
            f"{path}: key {key}: expected {'a number' if kind is float else 'an integer'} "
            f"in [{low}, {high}], got {value!r}"
        )
    return kind(value)


def load_device_config(path: str | Path) -> dict[str, Any]:
    """The file's settings as `DeviceConfig` keyword arguments plus `model` (or absent keys)."""
    path = Path(path)
    data = _read(path)
    for key, value in data.items():
        if key not in KEYS:
            raise DeviceConfigError(f"{path}: unknown key {key!r} (expected one of {sorted(KEYS)})")
        inner = KEYS[key]
        if inner is not None:
            if not isinstance(value, dict):
                raise DeviceConfigError(f"{path}: key {key}: expected a mapping of {sorted(inner)}")
            for sub in value:
                if sub not in inner:
                    raise DeviceConfigError(
                        f"{path}: unknown key {key}.{sub} (expected one of {sorted(inner)})"
                    )
    out: dict[str, Any] = {}
    if "draft_model" in data:
        if not isinstance(data["draft_model"], str) or not data["draft_model"]:
            raise DeviceConfigError(f"{path}: key draft_model: expected a file path")
        out["model"] = data["draft_model"]
    if "quantization" in data and data["quantization"] not in QUANTIZATIONS:
        raise DeviceConfigError(
            f"{path}: key quantization: expected one of {list(QUANTIZATIONS)}, "
            f"got {data['quantization']!r}"
        )
    spec = data.get("speculative_length", {})
    if spec:
        out["draft_policy"] = "adaptive"
    if "min" in spec:
        out["draft_min"] = _number(path, "speculative_length.min", spec["min"], int, 1, 64)
    if "max" in spec:
        out["draft_max"] = _number(path, "speculative_length.max", spec["max"], int, 1, 64)
    if out.get("draft_min", 1) > out.get("draft_max", 64):
        raise DeviceConfigError(f"{path}: key speculative_length: expected min <= max")
    if "target_acceptance" in spec:
        out["target_acceptance"] = _number(
            path, "speculative_length.target_acceptance", spec["target_acceptance"], float,
            0.01, 0.99,
        )  # fmt: skip
    net = data.get("network", {})
    if "retry_timeout" in net:
        out["timeout_ms"] = _number(path, "network.retry_timeout", net["retry_timeout"], float,
                                    1, 60000)  # fmt: skip
    if "max_retries" in net:
        out["retries"] = _number(path, "network.max_retries", net["max_retries"], int, 0, 100)
    return out
