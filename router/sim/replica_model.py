"""From a replica's configuration to its engine: the performance model, per replica."""

from __future__ import annotations

from router.config.schema import ReplicaConfig
from router.perf.model import DEFAULT_MAX_NUM_SEQS, Deployment, batch_step_function
from router.perf.profiles import ProfileCatalog
from router.sim.engine import Engine, StepCost


def deployment_for(replica: ReplicaConfig, catalog: ProfileCatalog) -> Deployment:
    """The hardware and model of a replica; ModelDoesNotFit or UnknownProfile say what is wrong."""
    return Deployment(
        gpu=catalog.gpu(replica.gpu_model),
        model=catalog.model(replica.model),
        tensor_parallel=len(replica.gpus),
    )


def step_cost(deployment: Deployment) -> StepCost:
    return batch_step_function(deployment)


def engine_for(
    replica: ReplicaConfig, catalog: ProfileCatalog, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
) -> Engine:
    deployment = deployment_for(replica, catalog)
    kv = deployment.kv_capacity_tokens
    if replica.kv_capacity_tokens is not None:
        kv = min(kv, replica.kv_capacity_tokens)
    return Engine(step_cost(deployment), kv_capacity_tokens=kv, max_num_seqs=max_num_seqs)
