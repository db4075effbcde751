"""The single controller's machinery: resource pools, worker groups and call dispatch."""

from rlplat.controller.resource_pool import ResourcePool
from rlplat.controller.worker_group import InProcessWorkerGroup, Pending, RayWorkerGroup, WorkerGroup

__all__ = ["InProcessWorkerGroup", "Pending", "RayWorkerGroup", "ResourcePool", "WorkerGroup"]
