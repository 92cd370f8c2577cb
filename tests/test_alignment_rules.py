"""The alignment's rules one at a time (watch/judging/alignment.py), with exact findings: rule 1 (a peer
still in its call never entered the collective), rule 2 on each count it reads (a skip, an extra
collective, a first call by majority, a tie, a minority, a peer not yet in the call), rule 3 (another
op or shapes), the join and its own timeout, a sub-mesh group, the weight-sync group, torch's
recorder where it is authoritative, a record with only the fields the store requires, and which of
several waits is judged.

The records are real flight recorders' (probe/flight_recorder.py), driven through actor.train
calls and their collectives without the work, as fleetrl/debug/fleet.py's simulated workers are;
what depends on when they ran (each beat's time, when a collective was entered, its call site) is
set so that findings are exact (an older worker's record, with only the fields the store requires,
is written out). tests/test_alignment.py holds the same rules on real Gloo ranks;
these run in-process in well under a second (the mutation run, benchmarks/diagnosis/mutation.sh)."""

from __future__ import annotations

from fleetrl.debug.fleet import Shaped
from fleetrl.probe.collectives import DEFAULT_GROUP, JOIN_GROUP, WEIGHT_SYNC_GROUP, WEIGHT_SYNC_JOIN
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.watch.judging.alignment import (
    WEIGHT_SYNC_GROUPS,
    Finding,
    behind_peers,
    collectives,
    diagnose,
    entered,
    held_up_by,
    is_member,
    waits_for,
)

TRAIN = "actor.train"
CLOCK = 1000.0  # each rank's own clock when it published the record judged
AGE = 0.5  # the record's age on the watcher's clock (heartbeat_age_s, as the watchdog annotates it)
NOW = 5000.0  # the watcher's clock at the judgement
SITE = "train.py:7 (step)"
GRADIENT = (Shaped((2,)),)


class Rank:
    """One rank's real flight recorder, driven through the calls and collectives of a test."""

    def __init__(self, rank: int, component: str = "actor"):
        self.recorder = Recorder(component, rank, 0)
        self.key = (component, rank)

    def calls(self, *made: int, op: str = "all_reduce", group: str = DEFAULT_GROUP) -> Rank:
        """Finished calls of actor.train, making `made[i]` collectives each."""
        for count in made:
            with self.recorder.in_phase(TRAIN):
                self.collectives(count, op, group)
        return self

    def collectives(self, count: int, op: str = "all_reduce", group: str = DEFAULT_GROUP) -> Rank:
        for _ in range(count):
            with self.recorder.in_collective(op, GRADIENT, group):
                pass
        return self

    def enters(self, phase: str = TRAIN, made: int = 0, group: str = DEFAULT_GROUP) -> Rank:
        """Begin a call of `phase` and make `made` collectives in it, staying in the call."""
        self.recorder.enter_phase(phase)
        return self.collectives(made, group=group)

    def waits(self, for_s: float, op: str = "all_reduce", tensors=GRADIENT, group: str = DEFAULT_GROUP) -> Rank:
        """Enter a collective that does not complete, `for_s` seconds before the beat judged."""
        self.recorder.collectives.enter(op, tensors, group)["started"] = CLOCK - for_s
        return self

    def record(self, age: float | None = AGE) -> dict:
        record = self.recorder.record() | {"time": CLOCK}
        if age is not None:
            record["heartbeat_age_s"] = age
        log = record["collectives"]
        for entry in [*log["in_flight"], *log["recent"], record["last_collective"]]:
            if entry:
                entry["call_site"] = SITE
        return record


def records(*ranks: Rank, age: float | None = AGE) -> dict:
    return {rank.key: rank.record(age) for rank in ranks}


def waiting(who: str, entry: str, verb: str = "waits") -> str:
    return f"{who} {verb} in {entry} ({SITE}, shapes [[2]])"


def waits_pairs(found: dict) -> set:
    """(rank, culprit) for every pair where `rank` waits in a collective `culprit` never entered;
    the same by both ways of asking it."""
    pairs = {(key, culprit) for key in found for culprit in found if waits_for(found, key, culprit)}
    assert pairs == {(key, peer) for key in found for peer in behind_peers(found, key)}
    return pairs


A0, A1, A2, E0 = ("actor", 0), ("actor", 1), ("actor", 2), ("env", 0)


def test_rule_1_a_rank_in_its_call_before_any_collective_is_named_not_the_rank_waiting_for_it():
    """Rank 0 waits in DDP's first gradient bucket (the second bucket in flight behind it);
    rank 1 is in its first call and entered nothing; env workers are no part of the group."""
    ranks = [
        Rank(0).enters().waits(10.0, "all_reduce (ddp grad bucket 0)").waits(9.0, "all_reduce (ddp grad bucket 1)"),
        Rank(1).enters(),
        Rank(0, "env").enters("env.step"),
    ]
    found = records(*ranks)
    summary = "actor rank 1 is behind: it has entered no collective yet, and it is in actor.train; " + waiting(
        "actor rank 0", "all_reduce (ddp grad bucket 0) #1"
    )
    finding = Finding("rank_missing_from_collective", summary, NOW - 10.5, A1, (A0,))
    assert diagnose(found, NOW, timeout_s=5.0) == finding
    assert diagnose(found, NOW, timeout_s=10.5) is None  # waited as long as the timeout, not longer
    assert diagnose(found, NOW, timeout_s=5.0, join_timeout_s=30.0) == finding  # the join's own: not this wait's
    # rank 1 past its own deadline first: the same finding, however briefly rank 0 has waited
    assert held_up_by(found, A1, NOW) == finding
    assert held_up_by(found, A0, NOW) is None and held_up_by(found, E0, NOW) is None
    assert waits_pairs(found) == {(A0, A1)}
    assert not waits_for(found, A0, ("actor", 9))  # no such rank


def test_rule_1_names_the_rank_behind_whichever_of_the_ranks_comes_first():
    """Rank 0 is the one in its call, rank 1 waits for it: each rank is asked about in turn."""
    found = records(Rank(0).enters(), Rank(1).enters().waits(10.0))
    summary = "actor rank 0 is behind: it has entered no collective yet, and it is in actor.train; " + waiting(
        "actor rank 1", "all_reduce #1"
    )
    finding = Finding("rank_missing_from_collective", summary, NOW - 10.5, A0, (A1,))
    assert diagnose(found, NOW, timeout_s=5.0) == finding
    assert held_up_by(found, A0, NOW) == finding


def test_a_record_with_only_the_fields_the_store_requires_is_judged_without_a_collective_log():
    """An older worker's record (probe/store.py: pid, beat, time, phase, phase_started; no collective
    log, no counts per call) has entered nothing: in its call, it is the rank behind; between calls,
    the counts cannot tell. Raising on it would stop a healthy run (watchdog_error)."""

    def least(rank: int, phase: str | None) -> dict:
        started = None if phase is None else CLOCK - 1.0
        return {"pid": 4000 + rank, "beat": 1, "time": CLOCK, "phase": phase, "phase_started": started}

    found = records(Rank(0).enters().waits(10.0)) | {A1: least(1, TRAIN)}
    summary = "actor rank 1 is behind: it has entered no collective yet, and it is in actor.train; " + waiting(
        "actor rank 0", "all_reduce #1"
    )
    assert diagnose(found, NOW, timeout_s=5.0) == Finding(
        "rank_missing_from_collective", summary, NOW - 10.5, A1, (A0,)
    )
    # rank 0 in a collective outside any call, rank 1 between calls: the same call (none) on both
    found = records(Rank(0).waits(10.0)) | {A1: least(1, None)}
    summary = (
        waiting("actor rank 0", "all_reduce #1") + ", which no other rank will enter: actor rank 1 finished its call "
        "after collective #0. actor rank 0 made more collectives (or optimisation steps) than the others "
        "(or actor rank 1 skipped collectives the others make: the counts per call cannot tell)"
    )
    assert diagnose(found, NOW, timeout_s=5.0) == Finding("collective_mismatch", summary, NOW - 10.5, A0, (A1,))


def test_rule_1_in_steady_state_the_rank_that_entered_fewer_is_named_for_all_that_wait():
    ranks = [Rank(r).calls(2, 2).enters(made=1) for r in range(3)]
    ranks[0].waits(8.0)
    ranks[1].waits(6.0)
    found = records(*ranks)
    summary = "actor rank 2 is behind: its last collective is all_reduce #5, and it is in actor.train; " + waiting(
        "actor rank 0, actor rank 1", "all_reduce #6", "wait"
    )
    assert diagnose(found, NOW, timeout_s=5.0) == Finding(
        "rank_missing_from_collective", summary, NOW - 8.5, A2, (A0, A1)
    )
    assert waits_pairs(found) == {(A0, A2), (A1, A2)}


def test_a_record_the_watcher_has_not_annotated_is_read_on_its_own_clock():
    """No heartbeat_age_s (the watchdog off): the wait is `now` minus its start, `now` the rank's."""
    found = records(Rank(0).enters().waits(10.0), Rank(1).enters(), age=None)
    assert diagnose(found, CLOCK, timeout_s=5.0).started == CLOCK - 10.0
    assert held_up_by(found, A1, CLOCK).started == CLOCK - 10.0
    assert diagnose(found, CLOCK, timeout_s=10.0) is None


def rule_2(waiter: Rank, *others: Rank) -> Finding | None:
    """The finding once `waiter` has waited 10 s (and the record's age) in its next collective."""
    return diagnose(records(waiter.waits(10.0), *others), NOW, timeout_s=5.0)


def test_rule_2_a_rank_that_finished_its_call_with_fewer_collectives_skipped_them():
    none = rule_2(Rank(0).calls(2, 2).enters(), Rank(1).calls(2, 2, 0))
    summary = (
        "actor rank 1 is behind: it finished call 3 of actor.train after 0 collective(s), 2 in the call before: "
        "it skipped collectives the others make (its last collective is all_reduce #4); "
    )
    assert none == Finding(
        "rank_missing_from_collective", summary + waiting("actor rank 0", "all_reduce #5"), NOW - 10.5, A1, (A0,)
    )
    one = rule_2(Rank(0).calls(2, 2).enters(made=1), Rank(1).calls(2, 2, 1))  # the waiting rank made as many as before
    assert one.culprit == A1 and one.summary.startswith(
        "actor rank 1 is behind: it finished call 3 of actor.train after 1 collective(s), 2 in the call before: "
        "it skipped collectives the others make (its last collective is all_reduce #5); "
    )


def test_rule_2_a_rank_that_made_more_collectives_than_in_the_call_before_is_named():
    found = records(Rank(0).calls(2, 2, 2), Rank(1).calls(2, 2).enters(made=2).waits(10.0))
    summary = (
        waiting("actor rank 1", "all_reduce #7") + ", which no other rank will enter: actor rank 0 finished its call "
        "after collective #6. actor rank 1 made more collectives (or optimisation steps) than the others "
        "(3 collectives in call 3 of actor.train, 2 in the call before)"
    )
    assert diagnose(found, NOW, timeout_s=5.0) == Finding("collective_mismatch", summary, NOW - 10.5, A1, (A0,))
    assert held_up_by(found, A0, NOW) is None  # rank 0 finished its call: rule 2's, not rule 1's


def test_rule_2_on_a_first_call_a_rank_that_made_no_collective_skipped_them():
    found = rule_2(Rank(0).enters(), Rank(1).calls(0))
    summary = (
        "actor rank 1 is behind: it finished call 1 of actor.train without any collective, while actor rank 0 "
        "entered 1 in it: it skipped the call's collectives (it has entered no collective yet); "
    )
    assert found == Finding(
        "rank_missing_from_collective", summary + waiting("actor rank 0", "all_reduce #1"), NOW - 10.5, A1, (A0,)
    )


def test_rule_2_on_a_first_call_the_larger_side_is_right_and_a_tie_cannot_tell():
    first = "(its last collective is all_reduce #1); "
    two_wait = rule_2(Rank(0).enters(made=1), Rank(1).enters(made=1).waits(9.0), Rank(2).calls(1))
    summary = "actor rank 2 is behind: it finished call 1 of actor.train without entering #2, which most ranks entered "
    assert two_wait == Finding(
        "rank_missing_from_collective",
        summary + first + waiting("actor rank 0, actor rank 1", "all_reduce #2", "wait"),
        NOW - 10.5,
        A2,
        (A0, A1),
    )
    mismatch = waiting("actor rank 0", "all_reduce #2") + ", which no other rank will enter: actor rank 1 finished its "
    mismatch += "call after collective #1. actor rank 0 made more collectives (or optimisation steps) than the others "
    tie = rule_2(Rank(0).enters(made=1), Rank(1).calls(1))
    cannot_tell = "(or actor rank 1 skipped collectives the others make: the counts per call cannot tell)"
    assert tie == Finding("collective_mismatch", mismatch + cannot_tell, NOW - 10.5, A0, (A1,))
    one_waits = rule_2(Rank(0).enters(made=1), Rank(1).calls(1), Rank(2).calls(1))
    assert one_waits == Finding(
        "collective_mismatch", mismatch + "(2 of 3 ranks finished without it)", NOW - 10.5, A0, (A1, A2)
    )


def test_rule_2_a_peer_that_made_as_many_as_the_call_before_did_not_skip_and_the_counts_cannot_tell():
    """Rank 1 finished call 3 after 2 collectives, as rank 0 made in call 2, one of them in group
    fsdp0: its count does not depart from the call before, and rank 0's (2 so far) does not either."""
    rank1 = Rank(1).calls(2, 2)
    with rank1.recorder.in_phase(TRAIN):
        rank1.collectives(1).collectives(1, group="fsdp0")
    found = rule_2(Rank(0).calls(2, 2).enters(made=1), rank1)
    summary = (
        waiting("actor rank 0", "all_reduce #6") + ", which no other rank will enter: actor rank 1 finished its call "
        "after collective #5. actor rank 0 made more collectives (or optimisation steps) than the others "
        "(or actor rank 1 skipped collectives the others make: the counts per call cannot tell)"
    )
    assert found == Finding("collective_mismatch", summary, NOW - 10.5, A0, (A1,))


def test_rule_2_a_peer_not_yet_in_this_call_is_not_compared_with_it():
    """Rank 2 finished call 2 (after 1 collective, 3 in call 1) and has not begun call 3, in which
    ranks 0 and 1 wait: its count is of another call than theirs and cannot tell a skip from an
    extra collective, and two waiting ranks are no majority over a rank that has not begun."""
    found = rule_2(Rank(0).calls(2, 2).enters(), Rank(1).calls(2, 2).enters().waits(9.0), Rank(2).calls(3, 1))
    summary = (
        waiting("actor rank 0", "all_reduce #5") + ", which no other rank will enter: actor rank 2 finished its call "
        "after collective #4. actor rank 0 made more collectives (or optimisation steps) than the others "
        "(or actor rank 2 skipped collectives the others make: the counts per call cannot tell)"
    )
    assert found == Finding("collective_mismatch", summary, NOW - 10.5, A0, (A2,))


def test_rule_3_a_peer_in_the_collective_with_other_shapes_or_another_op_is_named():
    for op, tensors, theirs in [
        ("all_reduce", (Shaped((3,)),), "shapes [[3]]"),
        ("all_gather", GRADIENT, "shapes [[2]]"),
    ]:
        found = records(Rank(0).calls(2).enters().waits(10.0), Rank(1).calls(2).enters().waits(7.0, op, tensors))
        summary = (
            f"actor ranks disagree on collective #3: actor rank 0 is in all_reduce #3 ({SITE}, shapes [[2]]), "
            f"actor rank 1 in {op} #3 ({SITE}, {theirs})"
        )
        # since the later of the two entered it: the mismatch began there
        assert diagnose(found, NOW, timeout_s=5.0) == Finding("collective_mismatch", summary, NOW - 7.5, A1, (A0,))
        on_their_clocks = {key: {k: v for k, v in r.items() if k != "heartbeat_age_s"} for key, r in found.items()}
        assert diagnose(on_their_clocks, CLOCK, timeout_s=5.0).started == CLOCK - 7.0


def test_rule_3_in_the_weight_sync_group_names_its_members_as_they_are():
    """Actor rank 0 broadcasts other shapes than rollout rank 0 receives in the same sync."""
    proof = 4  # the proof's collectives: every member made them
    actor = Rank(0).collectives(proof, group=WEIGHT_SYNC_GROUP).enters("actor.send_weights")
    rollout = Rank(0, "rollout").collectives(proof, group=WEIGHT_SYNC_GROUP).enters("rollout.receive_weights")
    actor.waits(10.0, "broadcast (weights)", group=WEIGHT_SYNC_GROUP)
    rollout.waits(7.0, "broadcast (weights)", (Shaped((3,)),), WEIGHT_SYNC_GROUP)
    summary = (
        "actor rank 0 and the rollout workers disagree on collective #5: actor rank 0 is in broadcast (weights) #5 "
        f"of group weight_sync ({SITE}, shapes [[2]]), rollout rank 0 in broadcast (weights) #5 of group "
        f"weight_sync ({SITE}, shapes [[3]])"
    )
    found = diagnose(records(actor, rollout), NOW, timeout_s=5.0)
    assert found == Finding("collective_mismatch", summary, NOW - 7.5, ("rollout", 0), (A0,))


def test_every_rank_in_the_same_collective_is_no_finding_of_the_alignment():
    """None behind, none different: a hang inside the collective itself (the deadline check's)."""
    found = records(Rank(0).calls(2).enters().waits(10.0), Rank(1).calls(2).enters().waits(7.0))
    assert diagnose(found, NOW, timeout_s=5.0) is None


def test_the_join_is_judged_after_its_own_timeout_and_names_the_rank_that_never_entered_it():
    def join(rank: Rank) -> Rank:
        return rank.waits(10.0, "join (gloo rendezvous)", (), JOIN_GROUP)

    found = records(join(Rank(0).enters("actor.init_distributed")), Rank(1).enters("actor.init_distributed"))
    summary = (
        "actor rank 1 is behind: it has entered no collective yet, and it is in actor.init_distributed; "
        f"actor rank 0 waits in join (gloo rendezvous) #1 of group join ({SITE}, shapes [])"
    )
    finding = Finding("rank_missing_from_collective", summary, NOW - 10.5, A1, (A0,))
    assert diagnose(found, NOW, timeout_s=5.0) == finding  # the join's timeout is the collectives' by default
    assert diagnose(found, NOW, timeout_s=30.0, join_timeout_s=5.0) == finding
    assert diagnose(found, NOW, timeout_s=5.0, join_timeout_s=30.0) is None
    assert diagnose(found, NOW, timeout_s=30.0) is None


def test_a_sub_mesh_group_waits_only_for_the_ranks_that_use_it():
    """Ranks 0 and 1 shard over group fsdp0, ranks 2 and 3 over fsdp1: rank 0 in fsdp0 #2 waits
    for rank 1 (which entered #1) and not for ranks 2 and 3, which never enter fsdp0."""
    ranks = [Rank(0).enters(made=1, group="fsdp0").waits(10.0, "all_gather", group="fsdp0")]
    ranks += [
        Rank(1).enters(made=1, group="fsdp0"),
        Rank(2).enters(made=2, group="fsdp1"),
        Rank(3).enters(made=2, group="fsdp1"),
    ]
    found = records(*ranks)
    summary = "actor rank 1 is behind: its last collective is all_reduce #1 of group fsdp0, and it is in actor.train; "
    summary += f"actor rank 0 waits in all_gather #2 of group fsdp0 ({SITE}, shapes [[2]])"
    assert diagnose(found, NOW, timeout_s=5.0) == Finding(
        "rank_missing_from_collective", summary, NOW - 10.5, A1, (A0,)
    )
    assert waits_pairs(found) == {(A0, A1)}


def test_the_weight_sync_group_is_actor_rank_0_and_every_rollout_worker_entered_or_not():
    """Group `weight_sync` (parallel/sync_group.py): actor rank 0 waits in a sync's broadcast for a
    rollout worker still in its call, which is named; actor rank 1, not a member, is not; and a
    rollout worker past its own deadline is named the same way (`held_up_by`). Its join waits for
    a rollout worker that never entered it, after the join's timeout."""
    proof = 4  # the proof's collectives: every member made them
    actor = Rank(0).collectives(proof, group=WEIGHT_SYNC_GROUP).enters("actor.send_weights")
    actor.waits(10.0, "broadcast (weights)", group=WEIGHT_SYNC_GROUP)
    late = Rank(1, "rollout").collectives(proof, group=WEIGHT_SYNC_GROUP).enters("rollout.receive_weights")
    there = Rank(0, "rollout").collectives(proof, group=WEIGHT_SYNC_GROUP).enters("rollout.receive_weights")
    there.waits(10.0, "broadcast (weights)", group=WEIGHT_SYNC_GROUP)
    found = records(actor, Rank(1).enters("actor.train"), there, late)
    assert behind_peers(found, A0) == [("rollout", 1)] and behind_peers(found, ("rollout", 0)) == [("rollout", 1)]
    finding = diagnose(found, NOW, timeout_s=5.0)
    assert finding.culprit == ("rollout", 1) and finding.waiting == (A0, ("rollout", 0)), finding
    assert finding.summary == (
        "rollout rank 1 is behind: its last collective is all_reduce #4 of group weight_sync, and it is in "
        "rollout.receive_weights; "
        + waiting("actor rank 0, rollout rank 0", "broadcast (weights) #5 of group weight_sync", "wait")
    ), finding.summary
    assert held_up_by(found, ("rollout", 1), NOW).culprit == ("rollout", 1)
    assert held_up_by(found, A1, NOW) is None

    joining = Rank(0).enters("actor.join_weight_sync").waits(10.0, "join (gloo rendezvous)", (), WEIGHT_SYNC_JOIN)
    found = records(joining, Rank(0, "rollout").enters("rollout.join_weight_sync"))
    assert diagnose(found, NOW, timeout_s=30.0, join_timeout_s=5.0).culprit == ("rollout", 0)
    assert diagnose(found, NOW, timeout_s=5.0, join_timeout_s=30.0) is None


def test_who_belongs_to_each_group():
    """The default group and its join: every actor or fused rank, entered or not; a sub-mesh group:
    the actor ranks that have entered it; the weight-sync group and its join: actor rank 0 and every
    rollout worker. Never an env or eval worker."""
    used, unused = {"collectives": {"entered": {"mesh": 2}}}, {"collectives": {"entered": {}}}
    ranks = [("actor", 1), ("fused", 0), ("env", 0), ("rollout", 0)]
    for group in (DEFAULT_GROUP, JOIN_GROUP):
        assert [is_member(key, unused, group) for key in ranks] == [True, True, False, False], group
    mesh = [(("actor", 1), used), (("actor", 2), unused), (("env", 0), used)]
    assert [is_member(key, record, "mesh") for key, record in mesh] == [True, False, False]
    for group in WEIGHT_SYNC_GROUPS:
        weight_sync = [("actor", 0), ("actor", 1), ("rollout", 3), ("env", 0), ("eval", 0)]
        assert [is_member(key, unused, group) for key in weight_sync] == [True, False, True, False, False], group


def test_of_several_waits_the_lowest_sequence_number_is_judged_first():
    """Rank 0 waits in actor #5 for rank 1, rank 1 in fsdp0 #2 for rank 0 (each group's order
    broken by the other): fsdp0 #2 is the earlier wait in the program's order, so rank 0 is named."""
    rank0 = Rank(0).calls(2, 2).enters().collectives(1, group="fsdp0").waits(10.0)
    rank1 = Rank(1).calls(2, 2).enters().collectives(1, group="fsdp0").waits(9.0, "all_gather", group="fsdp0")
    summary = "actor rank 0 is behind: its last collective is all_reduce #1 of group fsdp0, and it is in actor.train; "
    summary += f"actor rank 1 waits in all_gather #2 of group fsdp0 ({SITE}, shapes [[2]])"
    finding = Finding("rank_missing_from_collective", summary, NOW - 9.5, A0, (A1,))
    assert diagnose(records(rank0, rank1), NOW, timeout_s=5.0) == finding


def test_a_last_collective_no_longer_among_the_recent_is_named_by_its_number():
    """Rank 1's last collective of the default group, #4, is older than the 12 recent ones kept."""
    behind = Rank(1).calls(2, 2).enters().collectives(12, group="fsdp0")
    found = records(Rank(0).calls(2, 2).enters().collectives(12, group="fsdp0").waits(10.0), behind)
    assert diagnose(found, NOW, timeout_s=5.0).summary.startswith(
        "actor rank 1 is behind: its last collective is #4, and it is in actor.train; "
    )


def test_torch_s_recorder_is_read_only_where_it_is_authoritative():
    """On NCCL torch's recorder sees completion and fleetrl's log does not: there the trace is
    read (it shows rank 0 in #3); elsewhere fleetrl's own log (rank 0 between collectives)."""
    trace = Rank(0).calls(2).enters().waits(10.0).record()["collectives"]
    rank0, rank1 = Rank(0).calls(2).enters(), Rank(1).calls(2).enters()
    for authoritative in (True, False):
        found = records(rank0, rank1)
        found[A0]["torch_trace"] = {**trace, "authoritative": authoritative}
        assert collectives(found[A0]) == (found[A0]["torch_trace"] if authoritative else found[A0]["collectives"])
        finding = diagnose(found, NOW, timeout_s=5.0)
        if authoritative:
            assert (finding.cause, finding.culprit, finding.started) == ("rank_missing_from_collective", A1, NOW - 10.5)
        else:
            assert finding is None
    assert collectives({"torch_trace": None}) == {} and entered({}, DEFAULT_GROUP) == 0  # a record without a log


def test_on_nccl_a_mismatch_is_read_from_the_collectives_torch_s_trace_has_in_flight():
    """torch's trace lists the collectives in flight apart from its recent ones (refreshed only
    when a wait is old enough to fetch their detail): rank 1's other shapes are found in flight."""
    found = {}
    for rank, (waited_s, tensors) in enumerate([(10.0, GRADIENT), (7.0, (Shaped((3,)),))]):
        live = Rank(rank).calls(2).enters()
        trace = Rank(rank).calls(2).enters().waits(waited_s, "all_reduce", tensors).record()["collectives"]
        found[("actor", rank)] = live.record() | {"torch_trace": {**trace, "recent": [], "authoritative": True}}
    summary = (
        f"actor ranks disagree on collective #3: actor rank 0 is in all_reduce #3 ({SITE}, shapes [[2]]), "
        f"actor rank 1 in all_reduce #3 ({SITE}, shapes [[3]])"
    )
    assert diagnose(found, NOW, timeout_s=5.0) == Finding("collective_mismatch", summary, NOW - 7.5, A1, (A0,))
