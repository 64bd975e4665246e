//! The checker must catch a violation planted in an otherwise clean history, for each
//! rule, and pass the clean one.

use crate::record::{Fault, Group, Kind, Landed, RunInfo, Snapshot, Write};
use crate::rules::{check, Report};
use crate::{classify, Class, Input};
use std::collections::BTreeMap;

const MS: u64 = 1_000_000;

fn info() -> RunInfo {
    let group = |name: &str, targets: &[&str], claims: bool| Group {
        name: name.into(),
        targets: targets.iter().map(|s| s.to_string()).collect(),
        claims_order: claims,
        resources: vec![format!("/t/{name}/0")],
    };
    RunInfo {
        seed: 1,
        seconds: 10,
        groups: vec![group("pin-gw1", &["gw1"], true), group("envoy", &["envoy1"], false)],
        targets: [("gw1".to_string(), true), ("envoy1".to_string(), true)].into_iter().collect(),
        liveness_bound_ms: 1000,
        start_grace_ms: 0,
        apply_bound_ms: 1000,
        conditional: false,
        start: 0,
        end: 100_000 * MS,
    }
}

fn write(id: &str, resource: &str, target: &str, token: u64, start_ms: u64, status: u16) -> Write {
    Write {
        id: id.into(),
        client: "c".into(),
        group: "g".into(),
        resource: resource.into(),
        target: target.into(),
        kind: Kind::Valid,
        token: Some(token.to_string()),
        start: start_ms * MS,
        end: (start_ms + 5) * MS,
        status,
        highest: None,
        seq: None,
        upstream_error: false,
        error: None,
        body: String::new(),
        fault: None,
    }
}

fn landed(seq: u64, w: &Write) -> Landed {
    Landed {
        seq,
        at: w.start + 2 * MS,
        received: w.start + MS,
        resource: w.resource.clone(),
        token: w.token.clone().unwrap_or_default(),
        target: w.target.clone(),
        id: w.id.clone(),
    }
}

fn snapshot(at_ms: u64, marks: &[(&str, &str)]) -> Snapshot {
    Snapshot {
        after_fault: None,
        source: "etcd".into(),
        start: at_ms * MS,
        end: (at_ms + 1) * MS,
        marks: marks.iter().map(|(r, m)| (r.to_string(), m.to_string())).collect::<BTreeMap<_, _>>(),
    }
}

/// Two holders on each group's resource, the second superseding the first, whose late
/// write is refused; everything stored in order; the final marks read back.
fn clean() -> Input {
    let (p, e) = ("/t/pin-gw1/0", "/t/envoy/0");
    let mut writes = vec![
        write("a1", p, "gw1", 10, 0, 201),
        write("b1", p, "gw1", 20, 10, 201),
        write("a2", p, "gw1", 10, 20, 409),
        write("c1", e, "envoy1", 30, 0, 201),
        write("d1", e, "envoy1", 40, 10, 201),
    ];
    writes[2].highest = Some("20".into());
    let landed = vec![landed(1, &writes[0]), landed(2, &writes[3]), landed(3, &writes[1]), landed(4, &writes[4])];
    let snapshots = vec![snapshot(50, &[(p, "20"), (e, "40")])];
    Input { info: info(), writes, landed, faults: vec![], snapshots }
}

/// An injected fault `kind` on `targets` from `start_ms` to `healed_ms`, without a linger.
fn fault(kind: &str, targets: &[&str], start_ms: u64, healed_ms: u64) -> Fault {
    Fault {
        n: 1,
        kind: kind.into(),
        targets: targets.iter().map(|t| t.to_string()).collect(),
        start: start_ms * MS,
        healed: healed_ms * MS,
        injected: true,
        detail: String::new(),
        lingers_ms: 0,
        observed: false,
    }
}

fn rules(report: &Report) -> Vec<u8> {
    report.violations.iter().map(|v| v.rule).collect()
}

#[test]
fn a_clean_history_passes() {
    let report = check(&clean());
    assert_eq!(rules(&report), Vec::<u8>::new(), "{:?}", report.violations);
    assert!(report.window_hits.is_empty());
}

#[test]
fn a_stale_write_landing_after_a_newer_one_breaks_the_claim_or_counts_as_a_window_hit() {
    let mut input = clean();
    // a1 (token 10) lands after b1 (token 20) on the pinned resource: a violation.
    input.landed.swap(0, 2);
    for (i, l) in input.landed.iter_mut().enumerate() {
        l.seq = i as u64 + 1;
    }
    assert_eq!(rules(&check(&input)), vec![1]);
    // The same on the Envoy resource, where nothing claims it: a window hit.
    let mut input = clean();
    input.landed.swap(1, 3);
    let report = check(&input);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.window_hits.len(), 1);
}

#[test]
fn a_refused_write_that_landed_is_a_violation() {
    let mut input = clean();
    let late = landed(5, &input.writes[2]);
    input.landed.push(late);
    assert!(rules(&check(&input)).contains(&1));
}

#[test]
fn an_admit_below_an_acknowledged_one_is_not_linearizable() {
    let mut input = clean();
    // After b1 (20) returned, a1's token 10 is admitted again.
    input.writes[2].status = 201;
    input.writes[2].highest = None;
    assert!(rules(&check(&input)).contains(&2));
}

#[test]
fn a_mark_read_below_an_acknowledged_token_is_a_lost_mark() {
    let mut input = clean();
    input.snapshots.insert(0, snapshot(30, &[("/t/pin-gw1/0", "10")]));
    assert!(rules(&check(&input)).contains(&3));
}

#[test]
fn a_fault_whose_probe_never_stored_breaks_liveness() {
    let mut input = clean();
    input.faults.push(fault("gateway-kill", &["gw1"], 30, 40));
    let mut probe = write("p1", "/t/pin-gw1/0", "gw1", 50, 41, 503);
    probe.kind = Kind::Probe;
    probe.fault = Some(1);
    probe.body = "cannot decide".into();
    input.writes.push(probe);
    assert!(rules(&check(&input)).contains(&4));
}

#[test]
fn an_undecided_answer_needs_a_fault_on_its_target_and_a_missing_token_its_own_refusal() {
    let mut input = clean();
    let mut undecided = write("u1", "/t/pin-gw1/0", "gw1", 20, 30, 503);
    undecided.body = "cannot decide on ...".into();
    input.writes.push(undecided);
    assert_eq!(rules(&check(&input)), vec![5]);
    // With a fault on gw1 active meanwhile, it is accounted for.
    input.faults.push(fault("gateway-stop", &["gw1"], 25, 40));
    assert_eq!(rules(&check(&input)), Vec::<u8>::new());
    let mut missing = write("m1", "/t/pin-gw1/0", "gw1", 0, 60, 409);
    missing.kind = Kind::Missing;
    missing.token = None;
    input.writes.push(missing);
    assert_eq!(rules(&check(&input)), vec![5]);
}

/// A conditional write refused because writes given up on are lent on its resource
/// (503 "cannot write") is a documented answer that lasts past the fault that left the
/// lends: any earlier fault explains it; with none before it, it is a violation.
#[test]
fn a_refusal_for_writes_left_lent_needs_an_earlier_fault_not_an_active_one() {
    let mut input = clean();
    let mut lent = write("l1", "/t/pin-gw1/0", "gw1", 20, 80, 503);
    lent.body = "cannot write \"/t/pin-gw1/0\": 32 writes given up on may still be applied by the store".into();
    input.writes.push(lent);
    assert_eq!(rules(&check(&input)), vec![5], "no fault at all: unexplained");
    input.faults.push(fault("envoy-kill", &["envoy1"], 90, 95));
    assert_eq!(rules(&check(&input)), vec![5], "a fault after it does not explain it");
    input.faults.push(fault("etcd-quorum-loss-stop", &["envoy1"], 25, 40));
    assert_eq!(rules(&check(&input)), Vec::<u8>::new(), "one before it does, healed or not");
    // Logs of Envoy filters from before they answered it 503 read 409: the same class.
    if let Some(w) = input.writes.last_mut() {
        w.status = 409;
    }
    assert_eq!(classify(input.writes.last().unwrap()), Class::Lent);
    assert_eq!(rules(&check(&input)), Vec::<u8>::new(), "through Envoy too");
}

/// a1 was in flight through gw1 when the nemesis killed gw1; the store applied it
/// after b1.
fn killed_in_flight_then_applied_late() -> Input {
    let mut input = clean();
    input.writes[0].status = 0;
    input.writes[0].error = Some("io".into());
    input.landed.swap(0, 2);
    for (i, l) in input.landed.iter_mut().enumerate() {
        l.seq = i as u64 + 1;
    }
    input
}

#[test]
fn a_late_write_from_a_gateway_killed_with_it_in_flight_is_counted_apart_not_hidden() {
    let mut input = killed_in_flight_then_applied_late();
    let kill = |kind: &str| fault(kind, &["gw1"], 1, 3);
    input.faults.push(kill("gateway-kill-slow-upstream"));
    let report = check(&input);
    assert_eq!((rules(&report), report.crash_hits.len()), (vec![], 1), "{:?}", report.violations);
    // Any other fault does not explain it.
    input.faults[0] = kill("gateway-stop");
    assert!(rules(&check(&input)).contains(&1));
}

#[test]
fn with_conditional_writes_a_late_write_from_a_killed_gateway_or_past_the_bound_is_a_violation() {
    let mut input = killed_in_flight_then_applied_late();
    input.faults.push(fault("gateway-kill-slow-upstream", &["gw1"], 1, 3));
    input.info.conditional = true;
    input.info.apply_bound_ms = 0;
    let report = check(&input);
    assert_eq!((rules(&report), report.crash_hits.len()), (vec![1], 0), "the crash excuses nothing");
    input.landed[0].received = input.landed[0].at.saturating_sub(60_000 * MS);
    assert!(rules(&check(&input)).contains(&1), "nor does the time the store took");
}

#[test]
fn a_gateway_refusal_may_have_advanced_the_mark_to_its_own_token() {
    let mut input = clean();
    // a2 (token 15) is refused by the gate after waiting, reporting 20, but its admit
    // had set the mark to 15, which a later refusal reports.
    input.writes[2].token = Some("15".into());
    let mut later = write("z1", "/t/pin-gw1/0", "gw1", 12, 12, 409);
    later.highest = Some("15".into());
    later.end = 13 * MS;
    input.writes[1].start = 14 * MS;
    input.writes.push(later);
    input.writes[2].start = 11 * MS;
    input.writes[2].end = 25 * MS;
    assert_eq!(rules(&check(&input)), Vec::<u8>::new(), "{:?}", check(&input).violations);
}

#[test]
fn a_late_write_the_store_took_longer_than_the_bound_to_apply_is_counted_apart() {
    let mut input = clean();
    // a1 (token 10) lands after b1 (token 20): the store took 1.5 s to apply it,
    // past the 1 s bound the hosts were given.
    input.landed.swap(0, 2);
    for (i, l) in input.landed.iter_mut().enumerate() {
        l.seq = i as u64 + 1;
    }
    input.landed[2].at += 2_000 * MS;
    input.landed[2].received = input.landed[2].at - 1_500 * MS;
    let report = check(&input);
    assert_eq!(rules(&report), Vec::<u8>::new(), "{:?}", report.violations);
    assert_eq!(report.bound_exceeded.len(), 1);
    assert!(report.bound_exceeded[0].message.contains("took 1500 ms"), "{}", report.bound_exceeded[0].message);
    // Within the bound, the same landing is a violation.
    input.landed[2].received = input.landed[2].at - 900 * MS;
    assert_eq!(rules(&check(&input)), vec![1]);
}

#[test]
fn a_refusal_after_the_heal_is_explained_while_the_fault_still_lingers() {
    let mut input = clean();
    let mut undecided = write("u1", "/t/pin-gw1/0", "gw1", 20, 50, 503);
    undecided.body = "cannot decide on \"/t/pin-gw1/0\": timed out at the ordering gate ...".into();
    input.writes.push(undecided);
    let mut fault = fault("envoy-kill", &["gw1", "envoy1"], 25, 30);
    let mut probe = write("p1", "/t/pin-gw1/0", "gw1", 20, 31, 201);
    probe.kind = Kind::Probe;
    probe.fault = Some(1);
    input.writes.push(probe);
    input.faults.push(fault.clone());
    // The probe stored at once: without lingering, the 503 twenty ms later is unexplained.
    assert_eq!(rules(&check(&input)), vec![5]);
    // The killed Envoy's flights hold resources for a while after the heal.
    fault.lingers_ms = 100;
    input.faults[0] = fault;
    assert_eq!(rules(&check(&input)), Vec::<u8>::new(), "{:?}", check(&input).violations);
}

#[test]
fn a_refusal_during_a_stall_the_watch_saw_is_explained_and_one_after_its_linger_is_not() {
    let mut input = clean();
    let mut undecided = write("u1", "/t/pin-gw1/0", "gw1", 20, 50, 503);
    undecided.body = "cannot decide on \"/t/pin-gw1/0\": timed out at the ordering gate ...".into();
    input.writes.push(undecided);
    assert_eq!(rules(&check(&input)), vec![5]);
    let stall = Fault {
        // The torture run numbers observed stalls from a million (its stall watch).
        n: 1_000_001,
        lingers_ms: 10,
        observed: true,
        ..fault("observed-etcd-stall", &["gw1"], 40, 45)
    };
    input.faults.push(stall.clone());
    // Over at 55 ms with its linger; the write began at 50.
    assert_eq!(rules(&check(&input)), Vec::<u8>::new(), "{:?}", check(&input).violations);
    // Not the liveness bound of a probed fault: a write that began after the linger
    // is not explained by it.
    input.faults[0] = Fault { healed: 42 * MS, lingers_ms: 5, ..stall };
    let report = check(&input);
    assert_eq!(rules(&report), vec![5]);
    assert!(report.violations[0].message.contains("observed-etcd-stall"), "{}", report.violations[0].message);
}

#[test]
fn an_envoy_refusal_may_report_the_token_of_a_write_refused_for_the_stores_version() {
    // Conditional writes: x1 (token 50) is admitted and lent, then refused for the
    // store's version (409 "cannot write"); y1 (45) is refused by the filter's chain,
    // reporting 50, the highest lent. The mark did reach 50.
    let mut input = clean();
    let e = "/t/envoy/0";
    let mut conflict = write("x1", e, "envoy1", 50, 20, 409);
    conflict.body = "cannot write \"/t/envoy/0\": the store refused the write's precondition (412)".into();
    let mut refused = write("y1", e, "envoy1", 45, 22, 409);
    refused.highest = Some("50".into());
    input.writes.extend([conflict, refused]);
    input.snapshots = vec![snapshot(50, &[("/t/pin-gw1/0", "20"), (e, "50")])];
    let report = check(&input);
    assert!(!report.violations.iter().any(|v| v.message.contains("which no admit")), "{:?}", report.violations);
}

/// A conditional write refused for its version (409 "cannot write ... the store's
/// version moved") outside every fault is explained only by another client's write on
/// the same resource in flight meanwhile: a paused holder writing on beside its
/// successor (seed 52538205716477).
#[test]
fn a_version_conflict_needs_a_fault_or_another_writer_in_flight_on_its_resource() {
    let mut input = clean();
    let mut conflict = write("n1", "/t/envoy/0", "envoy1", 40, 80, 409);
    conflict.client = "successor".into();
    conflict.body = "cannot write \"/t/envoy/0\": the store's version moved from \"a\" to \"b\"".into();
    input.writes.push(conflict);
    assert_eq!(classify(input.writes.last().unwrap()), Class::Conflict);
    assert_eq!(rules(&check(&input)), vec![5], "alone: unexplained");
    // The same client's earlier write, or another client's on another resource, or one
    // that ended before it began: none explains it.
    let mut own = write("n0", "/t/envoy/0", "envoy1", 40, 78, 201);
    own.client = "successor".into();
    let mut elsewhere = write("x1", "/t/pin-gw1/0", "gw1", 0, 79, 428);
    (elsewhere.client, elsewhere.kind, elsewhere.token) = ("other".into(), Kind::Missing, None);
    let mut before = write("o0", "/t/envoy/0", "envoy1", 30, 70, 409);
    before.client = "paused".into();
    before.kind = Kind::Late;
    before.highest = Some("40".into());
    for w in [own, elsewhere, before] {
        input.writes.push(w);
        assert_eq!(rules(&check(&input)), vec![5], "{:?}", input.writes.last().map(|w| &w.id));
    }
    // A paused holder's late write on the resource, in flight meanwhile, does.
    let mut late = write("o1", "/t/envoy/0", "envoy1", 30, 82, 409);
    late.client = "paused".into();
    late.kind = Kind::Late;
    late.highest = Some("40".into());
    input.writes.push(late);
    assert_eq!(rules(&check(&input)), Vec::<u8>::new());
}

/// A conditional write refused for its version (412) outside every fault window and
/// with no other writer in flight is explained by a write the store applied late,
/// when that was the last the store applied on the resource: the fence never saw the
/// version it made (simulator seed 9219095423011918456: a write of a store-past-bound
/// fault applied at the window's end, the holder's next write 0.1 s after it).
#[test]
fn a_version_conflict_after_a_late_landing_on_its_resource_is_explained() {
    let mut input = clean();
    input.info.conditional = true;
    let e = "/t/envoy/0";
    // Given up on at 60 ms (504), applied by the store at 95 ms.
    let mut late = write("g1", e, "envoy1", 40, 55, 504);
    late.end = 60 * MS;
    let mut applied = landed(5, &late);
    (applied.received, applied.at) = (56 * MS, 95 * MS);
    let mut conflict = write("n1", e, "envoy1", 40, 100, 409);
    conflict.body = "cannot write \"/t/envoy/0\": the store refused the write's precondition (412)".into();
    input.writes.push(conflict);
    assert_eq!(rules(&check(&input)), vec![5], "no late landing: unexplained");
    input.writes.push(late.clone());
    input.landed.push(applied.clone());
    // The conflict is explained now; the 504 is not (no fault window covers it here).
    let ids = |input: &Input| check(input).violations.iter().flat_map(|v| v.ids.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&input), ["g1"]);
    // A write stored in time after the late one (the fence saw its version) takes the
    // explanation away.
    let mut after = write("d2", e, "envoy1", 40, 96, 201);
    after.end = 98 * MS;
    let mut stored = landed(6, &after);
    stored.at = 97 * MS;
    input.writes.push(after);
    input.landed.push(stored);
    assert_eq!(ids(&input), ["n1", "g1"]);
}
