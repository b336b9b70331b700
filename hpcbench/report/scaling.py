"""``scaling.json`` in a benchmark folder: the factor the official result summarizer multiplies a strong-scaling
(and training-suite) olympic mean by (``result_summarizer._get_scaling_factor``; the training rules' "New
normalized score = Submission-olympic-score * (RCP-mean / olympic-submission-epochs)"). The file is the one the
submitter shipped: the report runs the official tools on a copy of the folder (their RCP check rewrites the file),
so the figure hpcbench and the summarizer use is the shipped one. The summarizer ignores the file for weak scaling.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .discover import Group
    from .scoring import Score

SCALING_FILE = "scaling.json"
KEY = "scaling_factor"


class ScalingError(ValueError):
    """A scaling.json the summarizer cannot use; the message names the file and the key."""


def read_scaling(folder: Path) -> float | None:
    """The ``scaling_factor`` of ``folder/scaling.json``; None without the file. Raises :class:`ScalingError`
    for a file that is not a JSON object holding a finite number > 0 under ``scaling_factor`` (the summarizer
    reads ``contents['scaling_factor']`` and multiplies by it: it fails on such a file)."""
    path = Path(folder) / SCALING_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScalingError(f"{path}: not readable JSON ({exc}); expected {{\"{KEY}\": <number>}}") from exc
    if not isinstance(data, dict):
        raise ScalingError(f"{path}: expected a JSON object with the key '{KEY}', found {type(data).__name__}")
    if KEY not in data:
        raise ScalingError(f"{path}: the key '{KEY}' is missing (keys: {', '.join(map(repr, data)) or 'none'})")
    value = data[KEY]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ScalingError(f"{path}: '{KEY}' is {value!r}; expected a finite number > 0")
    return float(value)


def apply_scaling(s: "Score", group: "Group") -> None:
    """Strong scaling and training: ``s.olympic_min`` keeps the olympic mean and ``s.score_min`` becomes it times
    the shipped scaling.json's factor (unchanged without the file). An unusable file gives no score and a flag."""
    folder = Path(group.folder)
    path = folder / SCALING_FILE
    if s.mode != "strong":
        if path.is_file():
            s.notes.append(f"{path} ignored: the official summarizer applies scaling.json to strong-scaling scores only")
        return
    s.olympic_min = s.score_min
    try:
        factor = read_scaling(folder)
    except ScalingError as exc:
        s.score_min = None
        s.scaling_file = str(path)
        s.flags.append(f"unusable scaling.json: {exc} (the official summarizer multiplies the olympic mean by it and "
                       "fails on this file): no score")
        return
    if factor is None:
        return
    s.scaling_factor, s.scaling_file = factor, str(path)
    if s.olympic_min is not None:
        s.score_min = s.olympic_min * factor
        s.notes.append(f"score = olympic mean {s.olympic_min:.6f} min x scaling_factor {factor:.6g} from {path} (as "
                       f"shipped; the official summarizer applies it the same way) = {s.score_min:.6f} min")
    else:
        s.notes.append(f"{path}: scaling_factor {factor:.6g} (no olympic mean to scale)")
