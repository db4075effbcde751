"""Dataset mixtures (``data.train_files`` with a number per file, rlplat.data.mixture): the forms the key takes,
each file's rows per epoch, the draw over 2,000 rows, and an exact resume."""

from collections import Counter
from types import SimpleNamespace

import pandas as pd
import pytest

from rlplat.config import ConfigError
from rlplat.data import RLDataset
from rlplat.data.mixture import MixtureSampler, draws_per_epoch
from rlplat.trainer.components import prompt_sampler
from rlplat.models.tiny import build_tokenizer
from rlplat.trainer.run import load_run_config


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def files(tmp_path, sizes):
    paths = []
    for name, size in zip("ab", sizes):
        path = tmp_path / f"{name}.parquet"
        pd.DataFrame([{"data_source": name, "prompt": f"{name}{i}", "reward_model": {"ground_truth": "1"}}
                      for i in range(size)]).to_parquet(path)
        paths.append(str(path))
    return paths


def test_the_forms_of_a_mixture(tmp_path):
    a, b = files(tmp_path, [10, 10])
    weights = f"data.train_files=[{{path:{a},weight:0.7}},{{path:{b},weight:0.3}}]"
    assert load_run_config([weights])[1].train_mixture == ((a, "weight", 0.7), (b, "weight", 0.3))
    # open-instruct's list: a fraction of the file ("1.0", "0.5") or a row count ("3")
    _, plan = load_run_config([f"data.train_files=[{a},'1.0',{b},'3']"])
    assert plan.train_mixture == ((a, "share", 1.0), (b, "count", 3.0)) and plan.train_files == (a, b)
    assert load_run_config([f"data.train_files=[{a},{b}]"])[1].train_mixture == ((a, "all", 1.0), (b, "all", 1.0))
    assert draws_per_epoch([(a, "weight", 0.7), (b, "weight", 0.3)], [10, 30]) == [28, 12]
    assert draws_per_epoch([(a, "share", 0.5), (b, "count", 3)], [10, 30]) == [5, 3]
    for bad, message in [(f"[{{path:{a},weight:0}}]", r"data.train_files\[0\].weight must be a number > 0"),
                         (f"[{{path:{a},share:1}}]", r"data.train_files\[0\] must be \{path: <file>, weight"),
                         (f"[{a},'-1']", f"the number after {a} must be > 0")]:
        with pytest.raises(ConfigError, match=message):
            load_run_config([f"data.train_files={bad}"])
    with pytest.raises(ConfigError, match="data.val_files takes paths"):
        load_run_config([f"data.val_files=[{{path:{a},weight:1}}]"])


def test_a_70_30_mixture_draws_70_30_and_resumes_exactly(tmp_path, tokenizer):
    a, b = files(tmp_path, [50, 400])
    _, plan = load_run_config([f"data.train_files=[{{path:{a},weight:0.7}},{{path:{b},weight:0.3}}]",
                               "data.train_batch_size_prompts=16"])
    data = RLDataset([a, b], tokenizer, max_prompt_length=32)
    sampler = prompt_sampler(plan, data, SimpleNamespace(train_batch_size_prompts=16, shuffle=True, seed=3))
    assert isinstance(sampler, MixtureSampler) and sampler.draws == [315, 135]  # 450 rows an epoch, 70/30
    drawn = [i for _ in range(125) for i in sampler.next_batch()]  # 2,000 rows: 4 epochs and a part
    share_a = sum(i < 50 for i in drawn) / len(drawn)
    assert abs(share_a - 0.7) <= 0.02, share_a
    epoch = sampler.order(0)
    uses = Counter(i for i in epoch if i < 50)  # a's 50 rows, 315 draws: every row 6 or 7 times
    assert len(uses) == 50 and set(uses.values()) <= {6, 7} and sum(uses.values()) == 315
    assert len({i for i in epoch if i >= 50}) == 135  # b's 135 draws of 400 rows: all different
    state = sampler.state_dict()
    ahead = [sampler.next_batch() for _ in range(40)]  # across an epoch boundary
    resumed = MixtureSampler([50, 400], [315, 135], 16, seed=0)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(40)] == ahead
