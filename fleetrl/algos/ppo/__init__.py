"""PPO (`algorithm.name: ppo`): its config section, its update, its actor worker and registered spec.

GRPO is not a package of its own: it is PPO with group-relative advantages (`algorithm.adv_type: grpo`)."""
