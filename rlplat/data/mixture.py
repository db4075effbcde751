"""Dataset mixtures (``data.train_files`` with a number per file): how many rows each file gives an epoch, and
the sampler that draws them, interleaved at random, resumably.

A file's number reads as ``weight`` (``{path, weight}`` entries: relative to the others', an epoch as long as
all the files' rows together), ``share`` (open-instruct's fraction: 0.3 = 30% of the file's rows per epoch, 2.0
= each row twice) or ``count`` (open-instruct's row count per epoch); a plain path gives all its rows
(:data:`rlplat.config.plan.MIXTURE_KINDS`). Each epoch draws exactly that many rows of each file: a file's rows
in a random order, the order renewed each time the file runs out; the files' rows interleaved at random.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlplat.data.dataset import PromptSampler


def draws_per_epoch(parts: Sequence[tuple[str, str, float]], sizes: Sequence[int]) -> list[int]:
    """Rows each file gives one epoch: ``parts`` as :func:`rlplat.config.plan.as_mixture` gives them (the file's
    kind and number), ``sizes`` the files' usable rows."""
    total = sum(sizes)
    weights = sum(value for _, kind, value in parts if kind == "weight")
    draws = []
    for (path, kind, value), size in zip(parts, sizes):
        rows = {"weight": total * value / weights if weights else 0, "share": size * value, "count": value,
                "all": size}[kind]
        draws.append(max(1, round(rows)))
    return draws


class MixtureSampler(PromptSampler):
    """:class:`PromptSampler` over files of ``sizes`` rows (their indices one file after another, as the dataset
    holds them), an epoch drawing ``draws[i]`` rows of file ``i``; the same state resumes the same batches."""

    def __init__(self, sizes: Sequence[int], draws: Sequence[int], batch_size: int, seed: int = 0):
        super().__init__(sum(draws), batch_size, shuffle=True, seed=seed)
        self.sizes, self.draws = list(sizes), list(draws)
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]

    def order(self, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            rows = []
            for offset, size, draws in zip(self.offsets, self.sizes, self.draws):
                cycles = -(-draws // size)
                local = torch.cat([torch.randperm(size, generator=generator) for _ in range(cycles)])[:draws]
                rows.append(local + offset)
            joined = torch.cat(rows)
            self._order = (epoch, joined[torch.randperm(len(joined), generator=generator)].tolist())
        return self._order[1]
