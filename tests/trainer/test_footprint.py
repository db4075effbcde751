"""The controller process loads only what it uses: each module it needlessly imports is held in memory
for the whole run, on top of the workers' own copies (docs/performance.md)."""

import subprocess
import sys

from rlplat.data import generate, write_parquet

HEAVY = ("pandas", "tensordict", "torch._dynamo", "sympy")


def test_the_controller_reads_its_data_without_pandas_or_torchs_compiler(tmp_path):
    # pandas (~60 MB) is only for the preprocessing tools; tensordict would pull in torch._dynamo and
    # sympy (~85 MB). The model code of a worker loads the compiler stack itself; the controller never runs it.
    path = write_parquet(generate("arithmetic", 4, 0), tmp_path / "train.parquet")
    code = (
        "import sys\n"
        "import rlplat.trainer.main, rlplat.trainer.run, rlplat.trainer.ppo, rlplat.trainer.components\n"
        "from rlplat.data import RLDataset\n"
        "from rlplat.models.tiny import build_tokenizer\n"
        f"dataset = RLDataset({str(path)!r}, build_tokenizer(), max_prompt_length=64)\n"
        "assert len(dataset) == 4, len(dataset)\n"
        f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
