"""Checkpoints: a manifest verified on load, fallback to the previous good one, retention, failed saves,
and refusing to resume under a changed run-defining config."""

import errno
import json
import shutil

import pytest

from rlplat.trainer.main import main
from rlplat.trainer.run import load_run_config, run
from rlplat.trainer import checkpoint as ckpt
from rlplat.trainer.checkpoint import Checkpointer, verify
from rlplat.utils.errors import RunError


def args(out, steps, val, *extra):
    return [f"trainer.output_dir={out}", f"trainer.total_steps={steps}", f"data.val_files={val}",
            "trainer.test_freq=0", "trainer.save_freq=1", "trainer.max_checkpoints=2",
            "data.train_batch_size_prompts=4", "rollout.n=2", "rollout.val_n=1", "trainer.ray_address=inprocess",
            "actor.optim.lr_schedule=constant", *extra]


@pytest.fixture(scope="module")
def trained(embedded_cache, small_val, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "run"
    cfg, plan = load_run_config(args(out, 3, small_val))
    run(cfg, plan)
    return out


def copy(trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def checkpointer(out, small_val, *extra):
    cfg, _ = load_run_config(args(out, 3, small_val, *extra))
    return Checkpointer(cfg)


def test_retention_and_manifest(trained):
    root = trained / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert (root / "latest").read_text() == "step_000003"
    manifest = json.loads((root / "step_000003" / "manifest.json").read_text())
    assert "trainer.json" in manifest["files"] and any(f.startswith("actor/") for f in manifest["files"])
    assert manifest["config"]["algorithm.adv_estimator"] == "grpo"
    assert verify(root / "step_000003") is None


def truncate_shard(step):
    shard = next(p for p in (step / "actor").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-10])


@pytest.mark.parametrize("damage, problem", [
    (truncate_shard, "bytes, the manifest says"),
    (lambda step: (step / "actor" / ".metadata").unlink(), "actor/.metadata is missing"),
    (lambda step: (step / "trainer.json").write_text("{" * (step / "trainer.json").stat().st_size),
     "trainer.json does not match its checksum"),  # same size: only the checksum catches it
    (lambda step: (step / "manifest.json").unlink(), "no manifest.json"),
])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(trained, small_val, tmp_path, capsys, damage,
                                                                problem):
    out = copy(trained, tmp_path)
    (out / "checkpoints" / "notes.txt").write_text("a stray file is ignored")
    damage(out / "checkpoints" / "step_000003")
    assert checkpointer(out, small_val).resume_path().name == "step_000002"
    line = capsys.readouterr().out.strip()
    assert line.startswith("[checkpoint] warning: step_000003 is unusable: ") and problem in line
    assert line.endswith("resuming from step_000002 instead")


def test_latest_naming_a_missing_step_and_no_usable_checkpoint(trained, small_val, tmp_path, capsys):
    out = copy(trained, tmp_path)
    shutil.rmtree(out / "checkpoints" / "step_000003")
    assert checkpointer(out, small_val).resume_path().name == "step_000002"
    assert "checkpoints/latest names step_000003, which does not exist" in capsys.readouterr().out
    truncate_shard(out / "checkpoints" / "step_000002")
    with pytest.raises(RunError, match=r"^no usable checkpoint in .*step_000002 is unusable: .*resume_mode=disable"):
        checkpointer(out, small_val).resume_path()


def test_a_changed_config_is_refused_unless_allowed(trained, small_val, tmp_path):
    out = copy(trained, tmp_path)
    changed = checkpointer(out, small_val, "algorithm=rloo")
    path = changed.resume_path()
    with pytest.raises(RunError, match=r"algorithm.adv_estimator: 'grpo' -> 'rloo'.*resume_allow_config_change"):
        changed.check_config(path)
    checkpointer(out, small_val, "algorithm=rloo", "trainer.resume_allow_config_change=true").check_config(path)
    checkpointer(out, small_val, "trainer.total_steps=9").check_config(path)  # constant LR: extending is fine


def test_a_full_disk_leaves_the_previous_checkpoint_and_latest_intact(trained, small_val, tmp_path, capsys,
                                                                      monkeypatch):
    out = copy(trained, tmp_path)
    real = ckpt._write_atomic

    def disk_full(path, text):
        if path.name == "trainer.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(ckpt, "_write_atomic", disk_full)
    code = main(args(out, 4, small_val))
    full = capsys.readouterr().err
    err = full.strip().splitlines()[-1]
    assert code == 1 and "Traceback" not in full
    assert err.startswith(f"rlplat: saving the checkpoint of step 4 to {out}/checkpoints/step_000004 failed "
                          f"(OSError: [Errno 28] No space left on device")
    assert err.endswith(f"the previous checkpoint {out}/checkpoints/step_000003 and checkpoints/latest are intact")
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert (root / "latest").read_text() == "step_000003" and verify(root / "step_000003") is None
