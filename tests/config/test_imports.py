"""``trainer.imports``: a user's module outside the repository registers plug-ins before validation, in the
controller and (over Ray) in every worker."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

PLUGIN = textwrap.dedent('''
    """A user's plug-ins, living outside rlplat."""
    import torch

    from rlplat.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, AdvantageOutput, PolicyLossOutput
    from rlplat.algorithms.masked import sequence_scores

    CALLS = {"estimator": 0}


    @ADVANTAGE_ESTIMATORS.register("user_mean_baseline")
    def user_mean_baseline(inp):
        CALLS["estimator"] += 1
        scores = sequence_scores(inp.token_level_rewards, inp.response_mask)   # [batch]
        adv = (scores - scores.mean())[:, None] * inp.response_mask             # [batch, response_len]
        return AdvantageOutput(advantages=adv, returns=adv)


    @POLICY_LOSSES.register("user_reinforce")
    def user_reinforce(inp):
        # runs inside the training workers: proves they imported this module too
        loss = -inp.advantages * inp.log_prob * inp.response_mask
        return PolicyLossOutput(loss=loss, metrics={"user_loss_called": torch.tensor(1.0)})
''')


@pytest.fixture
def user_dir(tmp_path):
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "estimators.py").write_text(PLUGIN)
    (pkg / "broken.py").write_text("import not_a_module_anywhere\n")
    return tmp_path


def cli(user_dir, *args, pythonpath=True):
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    if pythonpath:
        env["PYTHONPATH"] = str(user_dir)
    return subprocess.run([sys.executable, "-m", "rlplat.trainer.main", *args], capture_output=True, text=True,
                          env=env, cwd=user_dir)


def test_without_the_import_the_name_is_unknown(user_dir):
    done = cli(user_dir, "algorithm.adv_estimator=user_mean_baseline", "--cfg", "job")
    assert done.returncode == 2 and "algorithm.adv_estimator='user_mean_baseline' is not registered" in done.stderr


def test_imported_module_registers_before_validation(user_dir):
    done = cli(user_dir, "trainer.imports=[my_pkg.estimators]", "algorithm.adv_estimator=user_mean_baseline",
               "algorithm.policy_loss=user_reinforce", "--cfg", "job")
    assert done.returncode == 0, done.stderr
    assert "adv_estimator: user_mean_baseline" in done.stdout and "- my_pkg.estimators" in done.stdout


def test_a_module_that_fails_to_import_is_one_line(user_dir):
    done = cli(user_dir, "trainer.imports=[my_pkg.broken]", "--cfg", "job")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("rlplat: config error: trainer.imports: cannot import 'my_pkg.broken': "
                                   "ModuleNotFoundError: No module named 'not_a_module_anywhere'")


@pytest.mark.parametrize("given, expected", [
    ("my_pkg/estimators.py", "'my_pkg/estimators.py' is a file name; the list takes module names, as an import "
     "statement does: trainer.imports=[my_pkg.estimators] (the module must be on PYTHONPATH, installed, or under "
     "the directory the command runs from)"),
    ("my_pkg.estimator", "cannot import 'my_pkg.estimator': ModuleNotFoundError: No module named "
     "'my_pkg.estimator'; did you mean 'my_pkg.estimators'?"),
    ("my_pkgs.estimators", "cannot import 'my_pkgs.estimators': ModuleNotFoundError: No module named 'my_pkgs'; "
     "did you mean 'my_pkg.estimators'?"),
])
def test_a_file_name_or_a_misspelt_module_gets_the_right_name(user_dir, monkeypatch, given, expected):
    from rlplat.config.errors import ConfigError
    from rlplat.config.imports import import_user_modules

    monkeypatch.syspath_prepend(str(user_dir))
    with pytest.raises(ConfigError) as err:
        import_user_modules([given])
    assert str(err.value) == f"trainer.imports: {expected}"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["inprocess", "ray"])
def test_user_plugins_train(user_dir, embedded_cache, small_val, where):
    """One training step with the user's estimator and policy loss; over Ray the loss runs in a worker
    process that only knows the module through trainer.imports (the module is found from the cwd)."""
    out = user_dir / f"out-{where}"
    args = ["trainer.imports=[my_pkg.estimators]", "algorithm.adv_estimator=user_mean_baseline",
            "algorithm.policy_loss=user_reinforce", "algorithm.use_kl_loss=false", "trainer.total_steps=1",
            "trainer.test_freq=0", f"data.val_files={small_val}", "data.train_batch_size_prompts=4",
            "actor.mini_batch_size_prompts=4", "rollout.n=2", "rollout.val_n=1", f"trainer.output_dir={out}",
            "actor.micro_batch_size_seqs_per_worker=8", "critic.micro_batch_size_seqs_per_worker=8"]
    if where == "inprocess":
        args.append("trainer.ray_address=inprocess")
    done = cli(user_dir, *args, pythonpath=False)  # `python -m` from user_dir puts it on the controller's path
    assert done.returncode == 0, done.stderr[-3000:]
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["actor/user_loss_called"] == pytest.approx(1.0)
