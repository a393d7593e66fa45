"""Code that runs inside vLLM's worker processes: load TLT's drafter in place, and keep it across sleep/wake.

verl's vLLM server passes ``worker_extension_cls``; vLLM mixes that class into its worker. TLT's extension
subclasses verl's own (whose weight sync must keep working) and adds methods the TLT server calls through
``engine.collective_rpc``:

- ``tlt_load_drafter(path, version)``: read an export's tensors (``verl_tlt.drafter.export`` or ``export_eagle3``
  layout) and load them into the running drafter: ``fc`` and the decoder layer, and for EAGLE-3 its final norm,
  own head and draft-vocabulary map (``d2t``). The embedding is never loaded: vLLM shares the target's module with
  the drafter, so loading it would overwrite the target's. vLLM also shares the target's LM head with an EAGLE-3
  drafter whose head equals it at start-up (an untrained drafter over the whole vocabulary): before its own head is
  loaded, such a drafter gets a copy, so the target's head is never written. A load that fails part-way restores
  the previous drafter's tensors, so the engine keeps the last good drafter.
- ``tlt_drafter_version()``: the version each worker runs.
- ``tlt_install_catch_up(window)``: K=0 steps skip the drafter, which is caught up when it next runs
  (``deferred_first_pass``); ``tlt_catch_up_stats()`` its counts.

Sleep: a level-2 sleep discards every weight, the drafter's too, and verl's weight sync restores the target only.
vLLM forbids extensions from overriding ``sleep``/``wake_up`` (a name-conflict assert), so the worker instance's
``wake_up`` is wrapped instead: after a wake-up that brought weights back, the drafter's last loaded tensors (a
CPU copy) are loaded again.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

logger = logging.getLogger(__name__)

# Tensor name prefixes of a drafter export that belong to the drafter alone (EAGLE-1: fc and the layer; EAGLE-3: also
# its layer's other name, final norm, own head and map). Never the embedding, which is the target's.
DRAFTER_OWN_PREFIXES = ("fc.", "layers.", "midlayer.", "norm.", "lm_head.", "d2t")


class TLTWorkerExtension(vLLMColocateWorkerExtension):
    def tlt_load_drafter(self, path: str, version: int) -> dict[str, Any]:
        """Load the export at `path` as drafter `version`; returns {"version", "loaded", "rank"}."""
        from verl_tlt.integrations.vllm.drafter_files import read_drafter_tensors

        self._tlt_install_wake_up_restore()
        model = self._tlt_draft_model()
        tensors = {name: t for name, t in read_drafter_tensors(path).items() if name.startswith(DRAFTER_OWN_PREFIXES)}
        if not tensors:
            raise ValueError(f"drafter version {version} at {path} has no drafter tensors (fc.*, layers.*, midlayer.*)")
        if any(name.startswith("lm_head.") for name in tensors):
            self._tlt_own_lm_head(model)
        previous = getattr(self, "_tlt_snapshot", None)
        try:
            _load(model, tensors)
        except Exception:
            if previous is not None:  # put back what a partial load overwrote
                _load(model, previous)
            raise
        self._tlt_snapshot = tensors  # read fresh from the file; `_load` hands vLLM copies, so this stays intact
        self._tlt_version = version
        return {"version": version, "loaded": len(tensors), "rank": getattr(self, "rank", 0)}

    def tlt_save_shared_weights(self, folder: str) -> str:
        """Write this worker's shard of the target's embedding (and LM head unless tied), by transformers name, to a
        safetensors file in `folder`; returns its path (tensors do not travel through collective_rpc intact)."""
        from safetensors.torch import save_file

        target = self.model_runner.model
        shared = {"model.embed_tokens.weight": target.model.embed_tokens.weight}
        lm_head = getattr(target, "lm_head", None)
        if lm_head is not None and lm_head is not target.model.embed_tokens:
            shared["lm_head.weight"] = lm_head.weight
        path = f"{folder}/shared-rank{getattr(self, 'rank', 0)}.safetensors"
        save_file({name: w.detach().to("cpu", copy=True).contiguous() for name, w in shared.items()}, path)
        return path

    def tlt_drafter_version(self) -> int | None:
        return getattr(self, "_tlt_version", None)

    def tlt_install_catch_up(self, window: int) -> dict[str, Any]:
        """Defer the drafter's first pass on K=0 steps (`window` positions per request at most); idempotent.
        Returns {"installed", "window", "reason"} (reason: why not, where this runner cannot)."""
        from verl_tlt.integrations.vllm.deferred_first_pass import DeferredFirstPass, unsupported_reason

        runner = self.model_runner
        current = getattr(runner, "_tlt_deferred_first_pass", None)
        if current is not None:
            return {"installed": current.enabled, "window": current.window, "reason": None}
        reason = unsupported_reason(runner)
        if reason is not None:
            logger.warning("TLT: the drafter's first pass runs every step (vLLM's own behaviour): %s", reason)
            return {"installed": False, "window": 0, "reason": reason}
        runner._tlt_deferred_first_pass = DeferredFirstPass(runner, window).install()
        return {"installed": True, "window": window, "reason": None}

    def tlt_catch_up_stats(self) -> dict[str, float]:
        current = getattr(self.model_runner, "_tlt_deferred_first_pass", None)
        return {} if current is None else current.stats()

    # ----- internals -------------------------------------------------------------------------------------------

    def _tlt_draft_model(self) -> torch.nn.Module:
        """The running drafter module, found by feature (vLLM 0.26+ API, the V1 runner's field, Model Runner V2)."""
        candidates = (
            lambda: self.get_draft_model() if hasattr(self, "get_draft_model") else None,
            lambda: self.model_runner.get_draft_model() if hasattr(self.model_runner, "get_draft_model") else None,
            lambda: getattr(getattr(self.model_runner, "drafter", None), "model", None),
            lambda: getattr(getattr(self.model_runner, "speculator", None), "model", None),
        )
        for find in candidates:
            model = find()
            if model is not None:
                return model
        raise RuntimeError(
            "TLT: this vLLM worker has no drafter model (was the engine started without speculative_config?)"
        )

    def _tlt_own_lm_head(self, model: torch.nn.Module) -> None:
        """Give the drafter its own copy of the LM head if vLLM shares the target's with it (see the module's doc)."""
        import copy

        target_head = getattr(getattr(self.model_runner, "model", None), "lm_head", None)
        head = getattr(model, "lm_head", None)
        if head is not None and target_head is not None and head is target_head:
            own = copy.deepcopy(head)
            # A parameter's deep copy drops vLLM's attributes (its weight_loader, which handles the head's padded
            # rows): put them back, methods bound to the copy.
            for key, value in vars(head.weight).items():
                bound = getattr(value, "__self__", None) is head
                setattr(own.weight, key, getattr(own, value.__name__) if bound else value)
            model.lm_head = own
            logger.info("TLT: the EAGLE-3 drafter shared the target's LM head; it now has its own copy")

    def _tlt_install_wake_up_restore(self) -> None:
        if self.__dict__.get("_tlt_wake_up_wrapped"):
            return
        wake_up = self.wake_up  # the bound method of vLLM's worker class

        def wake_up_and_restore(tags: list[str] | None = None) -> Any:
            result = wake_up(tags)
            snapshot = getattr(self, "_tlt_snapshot", None)
            if (tags is None or "weights" in tags) and snapshot is not None:
                _load(self._tlt_draft_model(), snapshot)
                logger.info("TLT: drafter version %s restored after wake-up", self.tlt_drafter_version())
            return result

        self.wake_up = wake_up_and_restore  # instance attribute: the class method stays vLLM's
        self.__dict__["_tlt_wake_up_wrapped"] = True


def _load(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """The drafter model's own loader (it fuses q/k/v and gate/up, and maps names), with copies of `tensors`."""
    model.load_weights((name, tensor.clone()) for name, tensor in tensors.items())
