"""PPG (`algorithm.name: ppg`): PPO's policy phase plus an auxiliary phase; config, update, actor, spec."""
