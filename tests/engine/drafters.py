"""Stand-in drafters for engine tests: a transformers model run from scratch on every prefix (stateless)."""

from __future__ import annotations

import torch

from verl_tlt.engine.drafts.base import DraftContext, Drafter


class HFModelDrafter(Drafter):
    """Drafts with a transformers causal LM (the target itself = a perfect drafter).

    sign=-1 negates the logits (an adversarial drafter: proposes what the target likes least); noise adds
    seeded Gaussian noise to the logits (a drafter that is only similar to the target).
    """

    def __init__(self, model, sign: float = 1.0, noise: float = 0.0, seed: int = 0, check_hidden: bool = False):
        self.model, self.sign, self.noise = model, sign, noise
        self.generator = torch.Generator().manual_seed(seed)
        self.uses_hidden_states = check_hidden
        self.node_prefixes: list[dict[int, list[int]]] = []
        self.hidden_checks = 0

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def begin(self, rows: list[DraftContext]) -> torch.Tensor:
        if self.uses_hidden_states:
            for row in rows:
                self._check_hidden(row)
        self.node_prefixes = [{0: list(row.token_ids)} for row in rows]
        return self._logits([row.token_ids for row in rows])

    def expand(self, node_ids, parent_ids, tokens) -> torch.Tensor:
        prefixes = []
        for row, table in enumerate(self.node_prefixes):
            for node, parent, token in zip(
                node_ids[row].tolist(), parent_ids[row].tolist(), tokens[row].tolist(), strict=True
            ):
                table[node] = table[parent] + [token]
                prefixes.append(table[node])
        return self._logits(prefixes).view(node_ids.shape[0], node_ids.shape[1], -1)

    def _logits(self, prefixes: list[list[int]]) -> torch.Tensor:
        length = max(len(p) for p in prefixes)
        input_ids = torch.zeros(len(prefixes), length, dtype=torch.long)
        attention = torch.zeros(len(prefixes), length, dtype=torch.long)
        for row, prefix in enumerate(prefixes):
            input_ids[row, : len(prefix)] = torch.tensor(prefix)
            attention[row, : len(prefix)] = 1
        with torch.no_grad():
            logits = self.model(input_ids=input_ids, attention_mask=attention).logits
        last = torch.tensor([len(p) - 1 for p in prefixes])
        logits = self.sign * logits[torch.arange(len(prefixes)), last]
        if self.noise:
            logits = logits + self.noise * torch.randn(logits.shape, generator=self.generator)
        return logits

    def _check_hidden(self, row: DraftContext) -> None:
        """The engine must hand over the target's final hidden states for positions [num_synced, len - 1)."""
        expected_count = len(row.token_ids) - 1 - row.num_synced
        assert row.hidden_states is not None and row.hidden_states.shape[0] == expected_count, (
            row.num_synced,
            len(row.token_ids),
            None if row.hidden_states is None else row.hidden_states.shape,
        )
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([row.token_ids[:-1]]), output_hidden_states=True)
        reference = out.hidden_states[-1][0, row.num_synced :]
        assert torch.allclose(row.hidden_states, reference, atol=1e-4), (row.hidden_states - reference).abs().max()
        self.hidden_checks += 1


class SyncCountingDrafter(HFModelDrafter):
    """Records the num_synced it is given, to check the engine's bookkeeping across slot moves."""

    def __init__(self, model):
        super().__init__(model)
        self.moves: list[tuple[int, int]] = []
        self.resets = 0

    def move_slot(self, src: int, dst: int) -> None:
        self.moves.append((src, dst))

    def reset(self) -> None:
        self.resets += 1
