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


EXPORTED: dict = {}  # run directory -> the steps exported to hf_export


def run_recording_exports(cfg, plan) -> list[int]:
    """Run, and return the steps whose actor was exported to hf_export (the real export runs)."""
    exported, real = [], Checkpointer.export

    def export(self, step, components):
        exported.append(step)
        return real(self, step, components)

    Checkpointer.export = export
    try:
        run(cfg, plan)
    finally:
        Checkpointer.export = real
    return exported


@pytest.fixture(scope="module")
def trained(embedded_cache, small_val, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "run"
    (out / ".hf_export-killed").mkdir(parents=True)  # what kill -9 during an export leaves behind
    (out / ".hf_export-killed" / "model.safetensors").write_bytes(b"half")
    cfg, plan = load_run_config(args(out, 3, small_val))
    EXPORTED[out] = run_recording_exports(cfg, plan)
    return out


def test_the_model_is_exported_once_at_the_end_and_stale_exports_are_removed(trained):
    assert EXPORTED[trained] == [3]  # three checkpoints (save_freq=1), one export
    assert (trained / "hf_export" / "model.safetensors").is_file()
    assert not list(trained.glob(".hf_export-*"))


def test_export_every_save(embedded_cache, small_val, tmp_path):
    cfg, plan = load_run_config(args(tmp_path / "run", 2, small_val, "trainer.export_every_save=true"))
    assert run_recording_exports(cfg, plan) == [1, 2]


def copy(trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def checkpointer(out, small_val, *extra):
    cfg, plan = load_run_config(args(out, 3, small_val, *extra))
    return Checkpointer(cfg, plan)


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
