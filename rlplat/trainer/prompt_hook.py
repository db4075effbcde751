"""``data.dynamic_prompts_fn``: the user's hook that picks the next prompts from this step's samples
(TRL-style curriculum / dynamic prompts), loaded once and checked on every call."""

from __future__ import annotations

import json
import numbers

from rlplat.config.imports import load_callable
from rlplat.data import RLDataset
from rlplat.protocol import Batch
from rlplat.utils.errors import RunError


class PromptHook:
    """Calls ``fn(step, samples)`` with one dict per response (``index``: its prompt's dataset index, -1 for a
    row the hook added; ``prompt``, ``data_source``, ``ground_truth``, ``extra_info``, ``completion``,
    ``score``). It returns None or a list of dataset indices and/or rows in the dataset schema."""

    def __init__(self, spec: str):
        self.fn = load_callable("data.dynamic_prompts_fn", spec)

    @staticmethod
    def samples(batch: Batch, completions: list[str]) -> list[dict]:
        """What the hook is given of a step's batch: one dict per response (``completions``: the decoded ones)."""
        nt = batch.non_tensors
        scores = batch.tensors["token_level_scores"].sum(-1).tolist()
        return [{"index": int(i), "prompt": p, "data_source": d, "ground_truth": g, "extra_info": e,
                 "completion": text, "score": s}
                for i, p, d, g, e, text, s in zip(nt["index"], nt["raw_prompt"], nt["data_source"], nt["ground_truth"],
                                                  nt["extra_info"], completions, scores)]

    def __call__(self, step: int, samples: list[dict], dataset: RLDataset) -> list[int | dict]:
        """The hook's picks for ``step``, checked: dataset indices (ints) and rows (JSON-able dicts that
        ``dataset`` can encode); a bad pick is a :class:`RunError` naming it."""
        try:
            picked = self.fn(step, samples)
        except Exception as err:  # the user's code: one line, not a traceback
            raise RunError(f"step {step}: data.dynamic_prompts_fn raised {type(err).__name__}: {err}") from err
        picked = [] if picked is None else picked
        expected = (f"expected None or a list of dataset indices in [0, {len(dataset)}) and/or rows "
                    f"(JSON-able dicts with data_source, prompt, reward_model; a row's images as file paths)")
        if not isinstance(picked, (list, tuple)):
            raise RunError(f"step {step}: data.dynamic_prompts_fn returned a {type(picked).__name__}; {expected}")
        queued: list[int | dict] = []
        for entry in picked:
            if isinstance(entry, numbers.Integral) and not isinstance(entry, bool) and 0 <= entry < len(dataset):
                queued.append(int(entry))
            elif isinstance(entry, dict) and _json_able(entry):
                dataset.encode_rows([entry], "data.dynamic_prompts_fn")  # a bad row fails now, not later
                queued.append(entry)
            else:
                raise RunError(f"step {step}: data.dynamic_prompts_fn returned {str(entry)[:80]!r}; {expected}")
        return queued


def _json_able(value) -> bool:
    """Whether ``value`` survives the checkpoint's JSON (the trainer state holds the queued rows)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
