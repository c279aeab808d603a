"""How the settings spell where a model's weights go when one device does not hold them, checked
without torch: a device map (accelerate's, as transformers takes it), the memory of each device,
and a size in bytes (``parse_bytes``: ``4GB``, ``16GiB``).

    device_map="auto"                                  # accelerate fills the GPUs, then the CPU, then disk
    device_map='{"embed_tokens": 0, "layers.0": 0, "layers.1": "cpu", "layers.2": "disk", ...}'
    device_map="placement.json"                        # the same map in a file
    max_device_memory="20GB"                           # each GPU (the CPU where there is none)
    max_device_memory="0=20GB,1=20GB,cpu=64GB"         # device by device

The map is loaded by transformers with accelerate (_model/loading/placement.py), which checks the devices
are there and every module has one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import OptionError

# accelerate's strategies (transformers' device_map strings)
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_DEVICE = re.compile(r"cpu|disk|mps|cuda(:\d+)?|\d+")
_FORMS = (
    "auto, balanced, balanced_low_0, sequential, a JSON object of module names to devices, or a .json file"
)


_BYTE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_bytes(text: object, name: str) -> int:
    """A size such as ``4GB``, ``512MB``, ``16GiB`` or a number of bytes, as a whole number of bytes."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = found.group(2).upper() if found else None
    if found is None or unit not in _BYTE_UNITS or float(found.group(1)) <= 0:
        raise OptionError(f"{name}={text!r} is not a size; write it as 4GB, 512MB, 16GiB or a byte count")
    return int(float(found.group(1)) * _BYTE_UNITS[unit])


def device_map_value(spec: str) -> str | dict[str, str | int]:
    """The value transformers takes for ``device_map``: a strategy, or a dict of module name to
    device (an int is a GPU index; "cpu", "disk", "cuda:1"…), from a string, JSON or a .json file."""
    text = spec.strip()
    if text in DEVICE_MAP_STRATEGIES:
        return text
    if text.endswith(".json") and not text.startswith("{"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise OptionError(f"device_map={spec!r}: no such file; pass {_FORMS}")
        text = path.read_text(encoding="utf-8")
    try:
        mapping = json.loads(text) if text.startswith("{") else None
    except json.JSONDecodeError as exc:
        raise OptionError(f"device_map={spec!r} is not valid JSON ({exc.msg}, character {exc.pos})") from None
    if not isinstance(mapping, dict) or not mapping:
        raise OptionError(f"device_map={spec!r} is not a device map; pass {_FORMS}")
    for module, device in mapping.items():
        ok = isinstance(device, int) and not isinstance(device, bool) and device >= 0
        if not (ok or (isinstance(device, str) and _DEVICE.fullmatch(device))):
            raise OptionError(
                f"device_map puts {module!r} on {device!r}, which is not a device; use a GPU index (0), "
                "'cuda:N', 'cpu', 'mps' or 'disk'"
            )
    return mapping


def device_map_text(value: object) -> str | None:
    """A device map as Settings keep it (a string, JSON-ready): a dict becomes its JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value)
    raise OptionError(f"device_map={value!r} must be a string or a dict; pass {_FORMS}")


def memory_caps(text: str) -> int | dict[str | int, int]:
    """``max_device_memory`` as one size (every GPU's, or a streamed model's budget) or device by
    device (``"0=20GB,1=20GB,cpu=64GB"``: a dict of GPU index or "cpu"/"mps" to bytes)."""
    if "=" not in text:
        return parse_bytes(text, "max_device_memory")
    caps: dict[str | int, int] = {}
    for part in text.split(","):
        device, _, size = part.partition("=")
        device = device.strip()
        if not _DEVICE.fullmatch(device) or device == "disk":
            raise OptionError(
                f"max_device_memory={text!r}: {device!r} is not a device; write it as 0=20GB,1=20GB,cpu=64GB "
                "(GPU index, cpu or mps; the disk has no cap)"
            )
        key: str | int = device
        if device.isdigit() or device.startswith("cuda"):  # accelerate names a GPU by its index
            key = int(device.partition(":")[2] or 0) if device.startswith("cuda") else int(device)
        caps[key] = parse_bytes(size, "max_device_memory")
    return caps
