"""The drafter a rollout engine starts with, as an EAGLE-1 export on disk (what vLLM's speculative_config loads).

``tlt.drafter.init`` is either an export (used as is, after validation against the target) or ``target``: the
drafter built from the target (its last decoder layer, fc passing the hidden state through; see
``EagleDrafterModel.from_target``), exported once per engine start. Never a random drafter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from verl_tlt.drafter.export import export_eagle
from verl_tlt.drafter.load import load_eagle
from verl_tlt.drafter.model import EagleDrafterModel
from verl_tlt.modeling.weights import load_drafter_parts


def initial_drafter_export(init: str, target_path: str, out_dir: str | os.PathLike) -> Path:
    """The export directory of the drafter `init` names for the target at `target_path`.

    An export is validated against the target (a drafter that does not fit fails here, naming what differs) and
    returned unchanged; "target" is built and written to `out_dir`. Only the target's parts a drafter uses are read
    (embedding, head, last layer): a rollout server never holds a second whole copy of the target for this.
    """
    target = load_drafter_parts(target_path)
    if init != "target":
        load_eagle(init, target)  # raises ValueError naming the path and the mismatch
        return Path(init)
    drafter = EagleDrafterModel.from_target(target)
    target_config = json.loads((Path(target_path) / "config.json").read_text())
    return export_eagle(drafter, out_dir, target_config=target_config, metadata={"init": "target"})
