"""Data: parquet prompts in the common RLHF schema, built-in task generators, batching.

``synthetic`` generates built-in tasks (``builtin:arithmetic``, ``builtin:countdown``) and resolves
``data.train_files`` / ``data.val_files``; ``dataset`` reads and checks parquet rows, tokenises prompts,
left-pads batches and yields a resumable, seeded order of prompt indices.
"""

import importlib

# Names are imported on first use: `python -m rlplat.data.synthetic` then starts without torch (seconds
# saved) and without runpy's warning about a module imported before it runs as __main__.
_SOURCES = {
    "rlplat.data.synthetic": ("TASKS", "DataError", "builtin_path", "generate", "resolve_files", "task_options",
                              "write_parquet"),
    "rlplat.data.dataset": ("PromptSampler", "RLDataset", "collate", "load_rows"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(importlib.import_module(_MODULE_OF[name]), name)
    raise AttributeError(f"module 'rlplat.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
