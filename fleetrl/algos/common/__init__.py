"""What several algorithms share: advantages (GAE, group-relative), the replay buffer, optimizers."""
