"""The single controller's machinery: resource pools, worker groups and call dispatch."""

from rlplat.controller.dispatch import Dispatch, register
from rlplat.controller.resource_pool import ResourcePool
from rlplat.controller.worker_group import InProcessWorkerGroup, RayWorkerGroup, Worker, WorkerGroup

__all__ = ["Dispatch", "InProcessWorkerGroup", "RayWorkerGroup", "ResourcePool", "Worker", "WorkerGroup", "register"]
