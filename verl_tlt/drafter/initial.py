"""The drafter a rollout engine starts with, as an export on disk (what vLLM's speculative_config loads).

``tlt.drafter.init`` is either an export (used as is, after validation against the target) or ``target``: the
drafter built from the target (its last decoder layer, fc passing the hidden state through; see
``EagleDrafterModel.from_target``), exported once per engine start. Never a random drafter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from verl_tlt.drafter.family import drafter_from_init, export_drafter
from verl_tlt.modeling.weights import load_drafter_parts


def initial_drafter_export(
    init: str, target_path: str, out_dir: str | os.PathLike, family: str = "eagle", *, draft_vocab_size: int = 0
) -> Path:
    """The export directory of the drafter `init` names for the target at `target_path`.

    An export is validated against the target and `family` (a drafter that does not fit fails here, naming what
    differs) and returned unchanged; "target" is built (a `family` drafter, EAGLE-3's head holding
    `draft_vocab_size` rows) and written to `out_dir`. Only the target's parts a drafter uses are read (embedding,
    head, final norm, last layer): a rollout server never holds a second whole copy of the target for this.
    """
    target = load_drafter_parts(target_path)
    drafter = drafter_from_init(init, target, family, draft_vocab_size=draft_vocab_size)  # ValueError if unfit
    if init != "target":
        return Path(init)
    target_config = json.loads((Path(target_path) / "config.json").read_text())
    return export_drafter(drafter, out_dir, target_config=target_config, metadata={"init": "target"})
