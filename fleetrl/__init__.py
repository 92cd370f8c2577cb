"""fleetrl: distributed reinforcement learning with PyTorch that never freezes silently."""
