"""torch.distributed shell: balancer, autograd-aware all-to-all, bag process groups.

Typical training step (every rank; ``init_process_group(..., timeout=...)`` done beforehand so a
misbehaving rank turns into an error instead of a hang)::

    balancer = Balancer("g1n2+g2n1+g4n1", CostModel.flops(d_model, gamma=1.0), num_heads=H)
    for batch in loader:                      # packed: x [T, C], pos [T] int64, lengths [n]
        balancer.plan_step(batch.lengths)     # all ranks, every step
        y = balanced_forward(model, balancer, batch.x, batch.pos)   # same layout as batch.x
        loss = loss_fn(y, batch.target)       # local loss in the original layout
        loss.backward()                       # gradients flow back through every all-to-all

Automatic bag layout: ``Balancer("auto", cost, num_heads=H, gpus_per_node=P, hysteresis=0.02,
window=1)`` chooses the layout in ``plan_step`` (every rank alike, from the gathered lengths);
``balancer.layout_spec`` / ``balancer.layout_changed`` are there for logging and
``state_dict()`` for checkpoints. Its bag process groups are all created at construction.
"""

from knapformer.distributed.autolayout import AutoLayout, node_local_bags
from knapformer.distributed.balancer import AttnInputs, Balancer, BalancerError
from knapformer.distributed.collectives import all_to_all
from knapformer.distributed.groups import (
    GroupSetupError,
    bag_process_group,
    cached_bag_group,
    clear_group_cache,
    create_bag_groups,
    group_cache_size,
)

__all__ = [
    "AttnInputs",
    "AutoLayout",
    "Balancer",
    "BalancerError",
    "GroupSetupError",
    "all_to_all",
    "bag_process_group",
    "cached_bag_group",
    "clear_group_cache",
    "create_bag_groups",
    "group_cache_size",
    "node_local_bags",
]
