"""Placement: device ranges resolved to ranks, nodes and threads, and each way to get one wrong."""

from __future__ import annotations

import pytest

from fleetrl.errors import ConfigError
from fleetrl.plan.placement import (
    Placement,
    check_divisible,
    parse_device_range,
    resolve_placement,
)

SEED_LAYOUT = {"actor": "0-7", "rollout": "0-3", "env": "8-11"}


def config_error(key: str, *fragments: str, **call) -> ConfigError:
    """Resolve `call`, expecting a ConfigError whose message names the key and each fragment."""
    with pytest.raises(ConfigError) as caught:
        resolve_placement(**call)
    message = str(caught.value)
    assert caught.value.key == key
    for fragment in (key, *fragments):
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return caught.value


def resolve(placement: dict, num_nodes: int = 2, devices_per_node: int = 8, **kwargs) -> Placement:
    return resolve_placement(num_nodes, devices_per_node, placement, **kwargs)


class TestSeedLayout:
    """2 nodes x 8 GPUs, actor 0-7, rollout 0-3, env 8-11: the dual-node freeze report's layout."""

    def test_actor_has_eight_ranks_on_node_zero(self):
        actor = resolve(SEED_LAYOUT).ranks("actor")
        assert [a.rank for a in actor] == list(range(8))
        assert [a.device for a in actor] == list(range(8))
        assert {a.node for a in actor} == {0}
        assert {a.world_size for a in actor} == {8}

    def test_rollout_shares_devices_zero_to_three_with_the_actor(self):
        placement = resolve(SEED_LAYOUT)
        rollout = placement.ranks("rollout")
        assert [a.device for a in rollout] == [0, 1, 2, 3]
        assert placement.nodes_of("rollout") == [0]
        assert placement.world_size("rollout") == 4
        assert placement.collocated("actor", "rollout")
        assert placement.collocated("rollout", "actor")

    def test_env_is_on_node_one_with_local_devices_zero_to_three(self):
        placement = resolve(SEED_LAYOUT)
        env = placement.ranks("env")
        assert [a.rank for a in env] == [0, 1, 2, 3]
        assert [a.device for a in env] == [8, 9, 10, 11]
        assert [a.local_device for a in env] == [0, 1, 2, 3]
        assert [a.visible_devices for a in env] == ["0", "1", "2", "3"]
        assert placement.nodes_of("env") == [1]

    def test_env_is_disaggregated_from_actor_and_rollout(self):
        placement = resolve(SEED_LAYOUT)
        assert not placement.collocated("env", "actor")
        assert not placement.collocated("env", "rollout")

    def test_table_lists_every_rank(self):
        table = resolve(SEED_LAYOUT, cpu_count_per_node=96).table()
        lines = table.splitlines()
        assert "2 node(s) x 8 device(s)" in lines[0]
        assert lines[1].split()[:4] == ["component", "rank", "node", "device"]
        assert len(lines) == 2 + 8 + 4 + 4
        assert lines[-1].split() == ["env", "3", "1", "11", "3", "3", "24"]


def test_cpu_slot_rehearsal_of_the_seed_layout():
    """The same shape on CPU slots: 2 nodes x 2 slots, actor 0-1, rollout 0, env 2-3."""
    placement = resolve({"actor": "0-1", "rollout": 0, "env": "2-3"}, 2, 2, cpu_count_per_node=6)
    assert [a.device for a in placement.ranks("actor")] == [0, 1]
    assert [a.device for a in placement.ranks("rollout")] == [0]
    assert [(a.node, a.local_device) for a in placement.ranks("env")] == [(1, 0), (1, 1)]
    assert placement.collocated("actor", "rollout")
    assert not placement.collocated("actor", "env")
    # node 0 runs 2 actor + 1 rollout processes; node 1 runs 2 env processes.
    assert [a.cpu_threads for a in placement.ranks("actor")] == [2, 2]
    assert [a.cpu_threads for a in placement.ranks("env")] == [3, 3]


def test_all_covers_every_device_of_every_node():
    placement = resolve({"actor": "all", "env": "all"}, num_nodes=2, devices_per_node=4)
    assert [a.device for a in placement.ranks("actor")] == list(range(8))
    assert placement.nodes_of("env") == [0, 1]
    assert [a.local_device for a in placement.ranks("env")] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_multi_segment_range_spans_nodes_in_device_order():
    placement = resolve({"actor": "8-11, 0-3", "env": "4-7,12-15"})
    actor = placement.ranks("actor")
    assert [a.device for a in actor] == [0, 1, 2, 3, 8, 9, 10, 11]
    assert [a.rank for a in actor] == list(range(8))
    assert placement.nodes_of("actor") == [0, 1]
    assert [a.node for a in actor] == [0] * 4 + [1] * 4


def test_single_device_as_int_and_as_text():
    placement = resolve({"actor": 0, "env": "5"})
    assert [a.device for a in placement.ranks("actor")] == [0]
    assert [a.device for a in placement.ranks("env")] == [5]


def test_missing_rollout_is_collocated_with_the_actor():
    placement = resolve({"actor": "0-3", "env": "8-11"})
    assert [a.device for a in placement.ranks("rollout")] == [0, 1, 2, 3]
    assert placement.collocated("actor", "rollout")


@pytest.mark.parametrize(
    "actor, env, rollout_devices",
    [
        ("0-3", "8-9", [0, 1]),  # 2 env ranks: 2 rollout ranks, one for each
        ("0-1", 0, [0]),  # one env rank: one rollout rank
        ("0-3", {"devices": "8-10", "processes_per_device": 2}, [0, 1, 2]),  # 6 env ranks: 3 divides them
        ("0-7", "8-11", [0, 1, 2, 3]),  # the seed report's layout, which names these explicitly
    ],
)
def test_missing_rollout_takes_as_many_actor_devices_as_divide_the_env_ranks(actor, env, rollout_devices):
    placement = resolve({"actor": actor, "env": env})
    assert [a.device for a in placement.ranks("rollout")] == rollout_devices
    assert placement.world_size("env") % placement.world_size("rollout") == 0


@pytest.mark.parametrize(
    "partial, expected",
    [
        ({"actor": "0-1"}, {"actor": [0, 1], "rollout": [0], "env": [0]}),
        ({"env": "2-3"}, {"actor": [0], "rollout": [0], "env": [2, 3]}),
        ({"rollout": 1}, {"actor": [0], "rollout": [1], "env": [0]}),
        ({}, {"actor": [0], "rollout": [0], "env": [0]}),
    ],
)
def test_components_not_named_keep_their_defaults(partial, expected):
    placement = resolve(partial)
    assert {c: [a.device for a in placement.ranks(c)] for c in expected} == expected


def test_processes_per_device_numbers_ranks_by_device_then_process():
    placement = resolve({"actor": "0-1", "env": {"devices": "8-9", "processes_per_device": 3}})
    env = placement.ranks("env")
    assert placement.world_size("env") == 6
    assert [(a.rank, a.device, a.process_index) for a in env] == [
        (0, 8, 0),
        (1, 8, 1),
        (2, 8, 2),
        (3, 9, 0),
        (4, 9, 1),
        (5, 9, 2),
    ]
    assert {a.world_size for a in env} == {6}


def test_devices_mapping_without_process_count_means_one_process():
    placement = resolve({"actor": {"devices": "0-1"}, "env": 2})
    assert [a.process_index for a in placement.ranks("actor")] == [0, 0]


class TestThreads:
    def test_node_cpus_split_among_all_processes_on_the_node(self):
        placement = resolve(SEED_LAYOUT, cpu_count_per_node=96)
        # node 0: 8 actor + 4 rollout processes; node 1: 4 env processes.
        assert {a.cpu_threads for a in placement.ranks("actor")} == {8}
        assert {a.cpu_threads for a in placement.ranks("rollout")} == {8}
        assert {a.cpu_threads for a in placement.ranks("env")} == {24}

    def test_processes_per_device_count_towards_the_split(self):
        placement = resolve(
            {"actor": 0, "env": {"devices": "1", "processes_per_device": 3}},
            num_nodes=1,
            devices_per_node=2,
            cpu_count_per_node=10,
        )
        # 1 actor + 1 rollout (collocated by default) + 3 env processes share 10 CPUs.
        assert {a.cpu_threads for a in placement.assignments} == {2}

    def test_at_least_one_thread_when_processes_outnumber_cpus(self):
        placement = resolve(SEED_LAYOUT, cpu_count_per_node=4)
        assert {a.cpu_threads for a in placement.assignments} == {1}

    def test_unknown_cpu_count_gives_one_thread(self):
        placement = resolve(SEED_LAYOUT)
        assert {a.cpu_threads for a in placement.assignments} == {1}


class TestParseDeviceRange:
    def test_ranges_are_sorted(self):
        assert parse_device_range("k", "6-7,0-1", 8) == [0, 1, 6, 7]

    def test_all(self):
        assert parse_device_range("k", "all", 3) == [0, 1, 2]

    def test_error_names_the_given_key(self):
        with pytest.raises(ConfigError, match="my.key"):
            parse_device_range("my.key", "9", 8)


@pytest.mark.parametrize("spec", ["3-1", "a-b", "0-", "-1", "0-3,", "1.5"])
def test_malformed_range_text(spec):
    config_error(
        "cluster.component_placement.env",
        repr(spec),
        num_nodes=2,
        devices_per_node=8,
        component_placement={"actor": "0-7", "env": spec},
    )


def test_backwards_range_suggests_the_fix():
    error = config_error(
        "cluster.component_placement.env",
        "'3-1'",
        "'1-3'",
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": 0, "env": "3-1"},
    )
    assert "backwards" in str(error)


@pytest.mark.parametrize("spec", [None, "", " ", [0, 1], 1.0, True])
def test_spec_that_is_not_a_range(spec):
    config_error(
        "cluster.component_placement.actor",
        repr(spec),
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": spec, "env": 0},
    )


def test_range_beyond_the_cluster_names_the_cluster_size():
    error = config_error(
        "cluster.component_placement.env",
        "'8-11'",
        "2 node(s) x 4 device(s)",
        "8 devices",
        "[8, 9, 10, 11]",
        num_nodes=2,
        devices_per_node=4,
        component_placement={"actor": "0-3", "rollout": "0-1", "env": "8-11"},
    )
    assert error.value == "8-11"


def test_device_beyond_the_cluster_as_int():
    config_error(
        "cluster.component_placement.actor",
        "16",
        "2 node(s) x 8 device(s)",
        num_nodes=2,
        devices_per_node=8,
        component_placement={"actor": 16, "env": 0},
    )


def test_negative_device_int():
    config_error(
        "cluster.component_placement.actor",
        "-1",
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": -1, "env": 0},
    )


def test_duplicate_devices_within_one_spec():
    config_error(
        "cluster.component_placement.actor",
        "'0-3,2-5'",
        "[2, 3]",
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": "0-3,2-5", "env": 6},
    )


def test_unknown_component_suggests_the_nearest():
    error = config_error(
        "cluster.component_placement.rollot",
        "'rollot'",
        "did you mean 'rollout'",
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": 0, "rollot": 0, "env": 1},
    )
    assert "['actor', 'rollout', 'env', 'eval']" in str(error)


def test_placement_that_is_not_a_mapping():
    config_error("cluster.component_placement", "'0-7'", num_nodes=1, devices_per_node=8, component_placement="0-7")


@pytest.mark.parametrize("processes", [0, -2, 1.5, "2", True])
def test_non_positive_processes_per_device(processes):
    config_error(
        "cluster.component_placement.env.processes_per_device",
        repr(processes),
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": 0, "env": {"devices": "1-2", "processes_per_device": processes}},
    )


def test_unknown_field_in_a_spec_mapping():
    config_error(
        "cluster.component_placement.env.process_per_device",
        "2",
        "did you mean 'processes_per_device'",
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": 0, "env": {"devices": 1, "process_per_device": 2}},
    )


def test_spec_mapping_without_devices():
    config_error(
        "cluster.component_placement.env.devices",
        "None",
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": 0, "env": {"processes_per_device": 2}},
    )


def test_bad_range_inside_a_spec_mapping_names_the_devices_key():
    config_error(
        "cluster.component_placement.env.devices",
        "'0-'",
        num_nodes=1,
        devices_per_node=8,
        component_placement={"actor": 0, "env": {"devices": "0-"}},
    )


@pytest.mark.parametrize(
    "key, shape",
    [
        ("cluster.num_nodes", {"num_nodes": 0, "devices_per_node": 8}),
        ("cluster.num_nodes", {"num_nodes": -1, "devices_per_node": 8}),
        ("cluster.devices_per_node", {"num_nodes": 2, "devices_per_node": 0}),
        ("cluster.devices_per_node", {"num_nodes": 2, "devices_per_node": 2.0}),
    ],
)
def test_cluster_shape_must_be_positive_integers(key, shape):
    bad_value = shape[key.split(".")[1]]
    config_error(key, repr(bad_value), component_placement={"actor": 0, "env": 0}, **shape)


def test_cpu_count_must_be_positive():
    config_error(
        "cluster.cpu_count_per_node",
        "0",
        num_nodes=1,
        devices_per_node=2,
        component_placement={"actor": 0, "env": 1},
        cpu_count_per_node=0,
    )


class TestCheckDivisible:
    def test_divisible_quantity_passes(self):
        check_divisible(resolve(SEED_LAYOUT), "env", "env.num_envs", 16)

    def test_indivisible_quantity_names_key_value_and_world_size(self):
        with pytest.raises(ConfigError) as caught:
            check_divisible(resolve(SEED_LAYOUT), "actor", "algorithm.minibatch_size", 12)
        message = str(caught.value)
        assert caught.value.key == "algorithm.minibatch_size"
        assert "algorithm.minibatch_size" in message
        assert "12" in message
        assert "a multiple of 8 (the actor world size)" in message


def test_unplaced_component_query_is_a_key_error():
    with pytest.raises(KeyError, match="critic"):
        resolve(SEED_LAYOUT).ranks("critic")
