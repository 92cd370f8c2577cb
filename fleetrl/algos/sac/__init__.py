"""SAC (`algorithm.name: sac`): config, networks, learner, replay-fed actor and rollout workers, spec."""
