"""A ``trainer.imports`` plug-in for the weight-sync test of a whole run: imported by a run's workers, it makes
every weight update the actor's rank 0 builds arrive with other bits in :data:`TENSOR` than its checksum says
(1 added to its first element after the checksums were taken), as a bucket damaged on its way would.

It patches :meth:`rlplat.workers.weight_sync.WeightUpdate.of` in every process that imports it, the controller's
too: a test that imports it restores the method itself (``monkeypatch.setattr`` before the run)."""

from rlplat.workers.weight_sync import WeightUpdate

TENSOR = "model.layers.0.mlp.up_proj.weight"

_built = WeightUpdate.of.__func__


def _damaged(cls, *args, **kwargs) -> WeightUpdate:
    update = _built(cls, *args, **kwargs)
    for bucket in update.buckets:
        for name, tensor in bucket:
            if name == TENSOR:  # in place: the update's own copy (and its packed buffer) changes
                tensor.view(-1)[0] += 1
    return update


WeightUpdate.of = classmethod(_damaged)
