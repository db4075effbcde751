"""Resource pools: devices reserved on a Ray cluster with one placement group per node.

A pool of ``nnodes x workers_per_node`` bundles, each bundle one device (a GPU, or CPU cores on CPU
machines). Each node's bundles form a STRICT_PACK placement group pinned to that node by its node-id
label, so rank r lives on node r // workers_per_node. Worker groups placed on the same pool share its
devices (colocation); a role placed on its own pool (e.g. a separate reference policy) gets its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rlplat.utils.errors import RunError

PLACEMENT_TIMEOUT_S = 120


def reserved_by_placement_groups() -> dict[str, dict[str, float]]:
    """The resources the placement groups in place (every pool's, this run's or another's) hold on each node."""
    from ray.util.placement_group import placement_group_table

    reserved: dict[str, dict[str, float]] = {}
    for group in placement_group_table().values():
        if group["state"] != "CREATED":
            continue
        for index, resources in group["bundles"].items():
            on_node = reserved.setdefault(group["bundles_to_node_id"][index], {})
            for key, amount in resources.items():
                on_node[key] = on_node.get(key, 0) + amount
    return reserved


@dataclass
class ResourcePool:
    nnodes: int
    workers_per_node: int
    device: str  # "cpu" | "cuda"
    cpus_per_worker: float = 1.0
    exclude_nodes: tuple[str, ...] = ()  # node ids another pool already uses, when roles must not share
    # CPU pools: the workers, of all pools, that compute on each node's cores at the same time (None = this
    # pool's workers_per_node): a separate rollout pool generates while the actor trains
    cores_shared_by: int | None = None
    section: str = "trainer"  # the config section that sizes the pool (its nnodes, workers_per_node keys)
    placement_groups: list[Any] = field(default_factory=list, init=False)
    node_ids: list[str] = field(default_factory=list, init=False)
    threads_per_worker: int = field(default=1, init=False)  # CPU threads each worker computes with (CPU pools)

    def _sizes(self) -> str:
        nodes = f"{self.section}.nnodes={self.nnodes} x " if self.section in ("trainer", "rollout") else ""  # others: one node
        return f"{nodes}{self.section}.workers_per_node={self.workers_per_node}"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.workers_per_node

    def _bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.cpus_per_worker}
        if self.device == "cuda":
            bundle["GPU"] = 1.0
        return bundle

    def _pick_nodes(self) -> list[str]:
        """``nnodes`` live nodes big enough for this pool's bundles: first those where the pools already placed leave
        them free (a separate pool goes to the node with room rather than wait behind a full one), then the others
        (their placement waits for the room)."""
        import ray

        need = self._bundle()

        def holds(resources: dict) -> bool:
            return all(resources.get(k, 0) >= v * self.workers_per_node for k, v in need.items())

        nodes = {node["NodeID"]: node["Resources"] for node in ray.nodes()
                 if node["Alive"] and node["NodeID"] not in self.exclude_nodes}
        fits = [node for node, total in nodes.items() if holds(total)]
        if len(fits) < self.nnodes:
            raise RunError(
                f"{self._sizes()} needs "
                f"{self.nnodes} Ray nodes each with {self.workers_per_node} x {need}; only {len(fits)} "
                f"node(s) qualify (ray.nodes() lists {len(ray.nodes())})"
            )
        reserved = reserved_by_placement_groups()
        free = [node for node in fits
                if holds({k: v - reserved.get(node, {}).get(k, 0) for k, v in nodes[node].items()})]
        return (free + [node for node in fits if node not in free])[: self.nnodes]

    def create(self) -> ResourcePool:
        """Reserve the bundles; raises a clear error if the cluster cannot hold them."""
        import ray
        from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group

        self.node_ids = self._pick_nodes()
        # a CPU worker reserves one core for scheduling, but computes with its node's cores split evenly, and
        # with no more threads than OMP_NUM_THREADS allows, where the controller's environment sets it
        cores = [int(node["Resources"].get("CPU", 1)) for node in ray.nodes() if node["NodeID"] in self.node_ids]
        share = max(1, min(cores) // (self.cores_shared_by or self.workers_per_node))
        limit = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # OpenMP's form may list nested levels
        self.threads_per_worker = min(share, int(limit)) if limit.isdigit() and int(limit) > 0 else share
        self.placement_groups = [
            placement_group(
                [self._bundle()] * self.workers_per_node,
                strategy="STRICT_PACK",
                bundle_label_selector=[{NODE_ID_LABEL_KEY: node_id}] * self.workers_per_node,
            )
            for node_id in self.node_ids
        ]
        ready, _ = ray.wait([pg.ready() for pg in self.placement_groups], num_returns=self.nnodes,
                            timeout=PLACEMENT_TIMEOUT_S)
        if len(ready) < self.nnodes:
            free = {key: value for key, value in ray.available_resources().items() if key in ("CPU", "GPU")}
            raise RunError(
                f"could not reserve {self._sizes()} workers of {self._bundle()} each within {PLACEMENT_TIMEOUT_S} s: "
                f"the Ray cluster has {free or 'nothing'} free after the pools before it; make the pools smaller, or give "
                f"Ray more (a CPU machine: ray start --head --num-cpus=N, then trainer.ray_address=auto)"
            )
        return self

    def actor_options(self, rank: int, share: float = 1.0) -> dict[str, Any]:
        """Ray ``.options()`` placing the worker of ``rank`` in its bundle, taking ``share`` of it."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        node, local = divmod(rank, self.workers_per_node)
        options: dict[str, Any] = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_groups[node], placement_group_bundle_index=local
            ),
            "num_cpus": self.cpus_per_worker * share,
        }
        if self.device == "cuda":
            options["num_gpus"] = share
        return options

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.placement_groups:
            remove_placement_group(pg)
        self.placement_groups = []
