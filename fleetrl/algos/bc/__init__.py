"""Behaviour cloning (`algorithm.name: bc`): the supervised stage, run by `fleetrl sft`."""
