"""Distributed training of the actor: process groups, DDP/FSDP2 wrapping, rank-invariant
minibatches, collectives on the training path and full (gathered) state dicts.

One idea per module:
  net            addresses and ports: is_loopback, loopback_interface, free_port (torch-free)
  process_group  join/leave the actor ranks' group (Gloo on CPU, NCCL on GPU), explicit timeout
  reduce         the collectives training needs: sums, rank 0's weights, replica checks
  sharding       which local samples make up each global minibatch on this rank
  wrap           the loss path: DDP or FSDP2 around the Policy, gradient sync and clipping
  state          full CPU state dicts of a (possibly sharded) policy and its optimizer
  weight_sync    what a sync sends: the full weights or the trainable tensors
  changed_values only the values that changed at the rollout's precision (runner.weight_sync: changed)
  sync_group     the weight-sync group of actor rank 0 and the rollout workers (transport: collective)
  sync_payload   a sync as one raw byte buffer and its header, what that group broadcasts
"""
