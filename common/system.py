"""System description: what the MLPerf logs say about the machine, and ``systems/<name>.json``.

Fields follow the official system-description JSON (``mlperf_logging.system_desc_checker``).
Values not given in a file are detected on this machine where possible.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .atomic import atomic_write_text
from .errors import ConfigError

Division = Literal["closed", "open"]
Status = Literal["onprem", "cloud", "preview", "research"]

#: set by every rendered job from its cache-drop step's exit status (1: dropped on every node, 0: the drop
#: failed); outside a rendered job the user states it (``HPCBENCH_CACHE_CLEARED=1 hpcbench train ...``)
CACHE_ENV = "HPCBENCH_CACHE_CLEARED"
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no", "")


def cache_cleared(environ: "os._Environ[str] | dict[str, str] | None" = None) -> bool:
    """MLPerf ``cache_clear``: whether the page cache was dropped before this run, as :data:`CACHE_ENV`
    says; False when it is not set (nobody said the cache was cleared)."""
    value = (os.environ if environ is None else environ).get(CACHE_ENV, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ConfigError(f"environment variable {CACHE_ENV}={value!r}: expected 1 (the page cache was dropped "
                          "before this run) or 0")
    return value in _TRUE


#: the MLPerf log's submission_status vocabulary -> the system file's "status" wording
STATUS_WORDS = {
    "onprem": "Available on-premise",
    "cloud": "Available cloud",
    "preview": "Preview",
    "research": "Research, Development, or Internal (RDI)",
}


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_capacity() -> str:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return f"{pages / 2**30:.0f} GB"
    except (ValueError, OSError, AttributeError):
        return "unknown"


@dataclass
class SystemDescription:
    submitter: str = "hpcbench"
    system_name: str = dataclasses.field(default_factory=lambda: socket.gethostname().split(".")[0])
    division: Division = "open"
    status: Status = "research"
    number_of_nodes: int = 1
    accelerators_per_node: int = 0
    host_processors_per_node: int = 1
    host_processor_model_name: str = dataclasses.field(default_factory=cpu_model)
    host_processor_core_count: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    host_processor_vcpu_count: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    host_processor_frequency: str = ""
    host_processor_caches: str = ""
    host_processor_interconnect: str = ""
    host_memory_capacity: str = dataclasses.field(default_factory=_mem_capacity)
    host_storage_type: str = ""
    host_storage_capacity: str = ""
    host_networking: str = ""
    host_networking_topology: str = ""
    host_memory_configuration: str = ""
    accelerator_model_name: str = ""
    accelerator_host_interconnect: str = ""
    accelerator_frequency: str = ""
    accelerator_on_chip_memories: str = ""
    accelerator_memory_configuration: str = ""
    accelerator_memory_capacity: str = ""
    accelerator_interconnect: str = ""
    accelerator_interconnect_topology: str = ""
    cooling: str = ""
    hw_notes: str = ""
    framework: str = ""
    other_software_stack: str = ""
    operating_system: str = dataclasses.field(default_factory=lambda: f"{platform.system()} {platform.release()}")
    sw_notes: str = ""

    def to_json_dict(self) -> dict[str, Any]:
        """The official JSON layout (note the hyphen in ``accelerator_on-chip_memories``). Every value
        is a string: the official system_desc_checker joins fields such as the core count with
        ``",".join`` and fails on a JSON number (the published submissions write "48", not 48)."""
        out = {k: str(v) for k, v in dataclasses.asdict(self).items()}
        out["accelerator_on-chip_memories"] = out.pop("accelerator_on_chip_memories")
        out["status"] = STATUS_WORDS[self.status]
        return out

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_json_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "SystemDescription":
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"system file {path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"system file {path} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"system file {path}: expected a JSON object")
        return cls.from_mapping(raw, source=str(path))

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], source: str = "system") -> "SystemDescription":
        raw = dict(raw)
        if "accelerator_on-chip_memories" in raw:
            raw["accelerator_on_chip_memories"] = raw.pop("accelerator_on-chip_memories")
        words_to_status = {v: k for k, v in STATUS_WORDS.items()}
        if raw.get("status") in words_to_status:
            raw["status"] = words_to_status[raw["status"]]
        from .config import apply_mapping

        for name in INT_FIELDS:  # written as strings (see to_json_dict); older files hold numbers
            value = raw.get(name)
            if isinstance(value, str):
                try:
                    raw[name] = int(value.strip())
                except ValueError:
                    raise ConfigError(f"{source}: '{name}' must be a whole number, got {value!r}") from None
        obj = cls()
        try:
            apply_mapping(obj, raw)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        return obj


def node_accelerators(configured: int, device_type: str, gpus_visible: int, ranks_on_node: int) -> int:
    """Accelerators per node for the logs and ``systems/<name>.json``: the configured count (a system file's),
    else the GPUs a node's ranks use (one each, at most the GPUs the node has); 0 only on a CPU run,
    which the official system_desc_checker accepts."""
    if configured or device_type != "cuda":
        return configured
    return max(1, min(gpus_visible, ranks_on_node))


#: fields that are whole numbers here and strings in the JSON file
INT_FIELDS = tuple(f.name for f in dataclasses.fields(SystemDescription) if f.type in ("int", int))
