"""Data: parquet prompts in the common RLHF schema, built-in task generators, batching."""

from rlplat.data.dataset import PromptSampler, RLDataset, collate, load_rows
from rlplat.data.synthetic import TASKS, DataError, builtin_path, resolve_files, write_parquet

__all__ = ["TASKS", "DataError", "PromptSampler", "RLDataset", "builtin_path", "collate", "load_rows",
           "resolve_files", "write_parquet"]
