"""rlplat from Python, in TRL's shape: ``GRPOTrainer(model=..., reward_funcs=[...], train_dataset=...).train()``.

    from rlplat.trainer import GRPOTrainer

    def exact(completions, ground_truth, **kwargs):          # TRL's signature: one call per batch
        return [float(c[0]["content"].strip() == answer) for c, answer in zip(completions, ground_truth)]

    trainer = GRPOTrainer(model="embedded", reward_funcs=[exact], train_dataset="builtin:arithmetic",
                          args={"trainer.total_steps": 3})
    print(trainer.train())                                     # the trained model: <output_dir>/hf_export

The trainer is rlplat's own: ``train()`` resolves and checks the config as ``python -m rlplat.trainer.main`` does
(``args``: overrides as a mapping or ``key=value`` strings; the algorithm defaults to the grpo preset) and runs the
same controller, on Ray or in this process (``trainer.ray_address=inprocess``). Rows of a ``datasets.Dataset``, a
pandas DataFrame or a list of dicts are written as parquet in the RLHF schema for the run (docs/python_api.md).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlplat.config.migration.convert import hydra_value
from rlplat.data.synthetic import write_parquet
from rlplat.reward.calls import function_name, is_batched
from rlplat.reward.scorers import REWARD_FUNCTIONS

# the columns a row of the RLHF schema has; any other column of a dataset travels in extra_info
SCHEMA = ("data_source", "prompt", "reward_model", "extra_info")
# validation without an eval_dataset: the first rows of the training set score the run before and after
VALIDATION_ROWS = 64


class GRPOTrainer:
    """``model``: a local directory, a hub id or ``embedded``. ``reward_funcs``: a callable or a list of them, TRL's
    batched ``fn(prompts, completions, **columns) -> list[float]`` or rlplat's per-sample
    ``fn(data_source, solution_str, ground_truth, extra_info) -> float``, or names of registered reward functions
    (``gsm8k``, ``math``, ...); ``reward_weights`` one weight each. ``train_dataset`` / ``eval_dataset``: rows (a
    ``datasets.Dataset``, a DataFrame, a list of dicts with a ``prompt`` of chat messages or text), or what
    ``data.train_files`` takes (parquet paths, ``builtin:<task>``). ``args``: rlplat overrides."""

    def __init__(self, model: str, reward_funcs: Callable | str | Sequence[Callable | str], train_dataset: Any,
                 eval_dataset: Any = None, args: Mapping[str, Any] | Iterable[str] | None = None,
                 reward_weights: Sequence[float] | None = None):
        self.model = str(model)
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not self.reward_funcs:
            raise ValueError("reward_funcs is empty: give at least one reward function")
        if reward_weights is not None and len(reward_weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(reward_weights)} entries for {len(self.reward_funcs)} "
                             "reward functions")
        self.reward_weights = reward_weights
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.args = _overrides(args)
        self.summary: dict | None = None

    def train(self) -> str:
        """Train; returns the trained model's directory (``<trainer.output_dir>/hf_export``), as Hugging Face's
        ``from_pretrained`` reads it. The run's summary is ``self.summary``."""
        from rlplat.trainer.run import load_run_config, run

        with tempfile.TemporaryDirectory(prefix="rlplat-data-") as data_dir:
            data, messages = self._data(Path(data_dir))
            overrides = ["algorithm=grpo", f"model.path={self.model}", *data, *self._rewards(messages), *self.args]
            cfg, plan = load_run_config(overrides)
            self.summary = run(cfg, plan)
        return self.summary["hf_export"]

    def _data(self, data_dir: Path) -> tuple[list[str], bool]:
        """The data overrides, and whether the training prompts are chat messages (else text)."""
        train, messages = _files(self.train_dataset, data_dir / "train.parquet", "train_dataset")
        if self.eval_dataset is not None:
            val, _ = _files(self.eval_dataset, data_dir / "val.parquet", "eval_dataset")
        elif isinstance(self.train_dataset, str):
            val = self.train_dataset  # rlplat's own data spec: validation on the same (a builtin task's test split)
        else:
            val, _ = _files(_records(self.train_dataset, "train_dataset")[:VALIDATION_ROWS],
                            data_dir / "val.parquet", "train_dataset")
        return [f"data.train_files={train}", f"data.val_files={val}"], messages

    def _rewards(self, messages: bool) -> list[str]:
        names = []
        for fn in self.reward_funcs:
            if isinstance(fn, str):
                names.append(fn)
                continue
            if not callable(fn):
                raise TypeError(f"reward_funcs: {fn!r} is neither a callable nor a registered name")
            if is_batched(fn) and not messages:
                fn = _TextCompletions(fn)  # TRL hands text completions to a dataset of text prompts
            name = function_name(fn)
            if name in REWARD_FUNCTIONS.names() and REWARD_FUNCTIONS.get(name) is not fn:
                name = f"{name}_{id(fn):x}"  # another function of that name is registered: this one's own
            REWARD_FUNCTIONS.add(name, fn)
            names.append(name)
        weights = self.reward_weights or [1.0] * len(names)
        return [f"reward.functions={hydra_value(names)}", f"reward.weights={hydra_value(list(weights))}"]


class _TextCompletions:
    """A batched reward function given text completions, as TRL gives them for a dataset of text prompts."""

    completions_as_messages = False
    batched = True

    def __init__(self, fn: Callable):
        self.fn, self.__name__ = fn, function_name(fn)

    def __call__(self, **arguments):
        return self.fn(**arguments)


def _overrides(args: Mapping[str, Any] | Iterable[str] | None) -> list[str]:
    if args is None:
        return []
    if isinstance(args, Mapping):
        return [f"{key}={hydra_value(value)}" for key, value in args.items()]
    overrides = [str(arg) for arg in args]
    if bad := [arg for arg in overrides if "=" not in arg]:
        raise ValueError(f"args: {bad[0]!r} is not a key=value override")
    return overrides


def _files(dataset: Any, path: Path, what: str) -> tuple[str, bool]:
    """What ``data.*_files`` gets for ``dataset``: rlplat's own spec as it is, or rows written to ``path``; and
    whether the prompts are chat messages (else text)."""
    if isinstance(dataset, (str, Path)) or (isinstance(dataset, list) and dataset and
                                             all(isinstance(item, (str, Path)) for item in dataset)):
        return hydra_value(dataset if not isinstance(dataset, Path) else str(dataset)), True
    records = _records(dataset, what)
    rows = [_schema_row(record, index, what) for index, record in enumerate(records)]
    return str(write_parquet(rows, path)), not any(isinstance(record.get("prompt"), str) for record in records)


def _records(dataset: Any, what: str) -> list[dict]:
    if hasattr(dataset, "to_dict") and hasattr(dataset, "columns"):  # a pandas DataFrame
        return dataset.to_dict("records")
    if hasattr(dataset, "to_list"):  # a datasets.Dataset
        return dataset.to_list()
    records = list(dataset)
    if not records or not all(isinstance(record, Mapping) for record in records):
        raise ValueError(f"{what}: expected rows (a datasets.Dataset, a DataFrame or a list of dicts), parquet "
                         f"paths or builtin:<task>; got {type(dataset).__name__} with {len(records)} item(s)")
    return [dict(record) for record in records]


def _schema_row(record: Mapping, index: int, what: str) -> dict:
    """One row of the RLHF schema: a text prompt becomes one user message; ``ground_truth`` (or an RLHF row's
    ``reward_model``) the answer; every other column an ``extra_info`` field (TRL's reward functions get them by
    name)."""
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    elif not (isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, Mapping) and "content" in m
                                                                   for m in prompt)):
        raise ValueError(f"{what} row {index}: 'prompt' must be text or chat messages ([{{'role': ..., "
                         f"'content': ...}}, ...]); got {str(prompt)[:80]!r} (columns: {sorted(record)})")
    extra = {key: value for key, value in record.items() if key not in (*SCHEMA, "ground_truth")}
    extra.update(record.get("extra_info") or {})
    row = {"data_source": str(record.get("data_source", "custom")), "prompt": [dict(m) for m in prompt],
           "extra_info": extra or {"index": index}}
    answer = record.get("reward_model") or ({"ground_truth": record["ground_truth"]} if "ground_truth" in record
                                            else None)
    if answer is not None:
        row["reward_model"] = answer
    return row
