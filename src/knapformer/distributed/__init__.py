"""torch.distributed shell: balancer, autograd-aware all-to-all, bag process groups.

Typical training step (every rank; ``init_process_group(..., timeout=...)`` done beforehand so a
misbehaving rank turns into an error instead of a hang)::

    balancer = Balancer("g1n2+g2n1+g4n1", CostModel.flops(d_model, gamma=1.0), num_heads=H)
    parallelize(model, mesh, balancer)        # the MMDiT's attention + dispatcher, FSDP2
    for batch, target in loader:              # PackedBatch (packed sequences), visual target
        balancer.plan_step(batch.seq_lens)    # all ranks, every step
        pred = model(batch)                   # routed in, balanced blocks, routed back
        loss_fn(pred, target).backward()      # gradients flow back through every all-to-all

Automatic bag layout: ``Balancer("auto", cost, num_heads=H, gpus_per_node=P, hysteresis=0.02,
window=1)`` chooses the layout in ``plan_step`` (every rank alike, from the gathered lengths);
``balancer.layout_spec`` / ``balancer.layout_changed`` are there for logging and
``state_dict()`` for checkpoints. Its bag process groups are created when a layout that needs
them is first chosen (every rank switches at the same step, so creation is collective there);
``balancer.process_groups_created`` counts them. A fixed layout creates its groups at
construction.
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
