//! The five rules (tests/README.md, "Torture"):
//!
//! 1. **Store order.** On each resource, once the store applied a write carrying token
//!    t', it never afterwards applies one carrying a lower token. A breach is a
//!    violation where the resource's group claims it (every group does: one host's
//!    ordering gate, or several sharing the in-flight registry), and a counted *window
//!    hit* elsewhere. A late write that the store itself took longer than the store
//!    apply bound to apply is counted apart (*bound exceeded*): the gate's one timing
//!    assumption did not hold for it. Also: the store applies only writes that were
//!    sent, with the token sent, and never one whose client was refused.
//! 2. **Linearizable admits** against a max-register, per resource, across every host
//!    sharing the marks (`fencekeeper_harness::max_register`).
//! 3. **No acknowledged mark lost**: every read-back of the marks (after each restart,
//!    and at the end) is at least the highest token acknowledged before it.
//! 4. **Liveness**: after every fault heals, a fresh holder's write through each target
//!    it disturbed is stored within the bound.
//! 5. **Accounting**: every answer is one of the contract's (stored, stale, missing,
//!    malformed, undecided, or the store's own failure); missing and malformed tokens
//!    get exactly their refusal; answers only a fault explains (undecided, no answer,
//!    store failures) come only while a fault disturbing that target is active; a
//!    conditional write's version conflict also when another client's write on its
//!    resource was in flight meanwhile (a paused holder writing on beside its successor),
//!    or when the last write the store applied on its resource was applied late.

use crate::record::{Kind, Write};
use crate::{classify, Class, Input};
use fencekeeper_harness::max_register::{self, Answer, Op};
use std::collections::{BTreeMap, HashMap};

/// A breach of a rule (or, for rule 1 where nothing claims it, a window hit).
#[derive(Clone, Debug)]
pub struct Finding {
    /// `1`..`5`.
    pub rule: u8,
    /// The resource, when the finding is about one.
    pub resource: Option<String>,
    /// What is wrong.
    pub message: String,
    /// The stamp where it shows.
    pub at: u64,
    /// The writes involved (ids).
    pub ids: Vec<String>,
}

/// What the checker found.
#[derive(Default)]
pub struct Report {
    /// Writes checked.
    pub writes: usize,
    /// Writes the store applied.
    pub landed: usize,
    /// Answers by class.
    pub classes: BTreeMap<&'static str, u64>,
    /// Breaches of a claim.
    pub violations: Vec<Finding>,
    /// Rule 1 breaches where no claim is made, per group.
    pub window_hits: Vec<Finding>,
    /// Rule 1 breaches whose late write the store took longer than the store apply
    /// bound to apply (the timing assumption broken, not the gate).
    pub bound_exceeded: Vec<Finding>,
    /// Rule 1 breaches on a claimed group whose late write was in flight through a
    /// gateway that was killed meanwhile: its ordering gate died with it
    /// (docs/gateway.md, "What remains").
    pub crash_hits: Vec<Finding>,
    /// Writes applied per group.
    pub landed_by_group: BTreeMap<String, u64>,
    /// Per fault kind: (injected, not injected).
    pub faults: BTreeMap<String, (u64, u64)>,
    /// The slowest recovery after a heal, in ms.
    pub slowest_recovery_ms: u64,
    /// Gateway refusals (each may have advanced the mark to its token first).
    pub gate_refusals: u64,
    /// Envoy refusals (answered from the filter's local copy of the marks), and those
    /// whose reported mark was already below one acknowledged before they began.
    pub envoy_refusals: (u64, u64),
}

/// When a fault's disturbance of each target ended: its probe's first stored write
/// through that target, or its heal plus the liveness bound.
struct Window {
    /// The fault's number and kind.
    n: u64,
    kind: String,
    targets: Vec<String>,
    start: u64,
    end: BTreeMap<String, u64>,
    fallback_end: u64,
}

/// Check every rule.
pub fn check(input: &Input) -> Report {
    let mut report = Report { writes: input.writes.len(), landed: input.landed.len(), ..Report::default() };
    let classes: Vec<Class> = input.writes.iter().map(classify).collect();
    for c in &classes {
        *report.classes.entry(c.word()).or_default() += 1;
    }
    let windows = windows(input, &mut report);
    store_order(input, &classes, &mut report);
    report.gate_refusals = input
        .writes
        .iter()
        .zip(&classes)
        .filter(|(w, c)| **c == Class::Stale && !w.target.starts_with("envoy"))
        .count() as u64;
    linearizable(input, &classes, &mut report);
    marks_kept(input, &classes, &mut report);
    accounting(input, &classes, &windows, &mut report);
    report
}

fn ms(nanos: u64) -> u64 {
    nanos / 1_000_000
}

fn windows(input: &Input, report: &mut Report) -> Vec<Window> {
    let bound = input.info.liveness_bound_ms * 1_000_000;
    let mut out = Vec::new();
    // Each fault's probes, in the writes' order: one pass over the writes, not one per
    // fault (a simulated run has hundreds of faults and millions of writes).
    let mut probes_of: HashMap<u64, Vec<&Write>> = HashMap::new();
    for w in input.writes.iter().filter(|w| w.kind == Kind::Probe) {
        if let Some(n) = w.fault {
            probes_of.entry(n).or_default().push(w);
        }
    }
    for f in &input.faults {
        let entry = report.faults.entry(f.kind.clone()).or_default();
        if !f.injected {
            entry.1 += 1;
            continue;
        }
        entry.0 += 1;
        let probes: &[&Write] = probes_of.get(&f.n).map_or(&[], Vec::as_slice);
        let mut end = BTreeMap::new();
        let mut probed: Vec<&str> = probes.iter().map(|w| w.target.as_str()).collect();
        probed.dedup();
        for target in probed {
            let first =
                probes.iter().filter(|w| w.target == target && classify(w) == Class::Stored).map(|w| w.end).min();
            match first {
                Some(t) if t <= f.healed + bound => {
                    report.slowest_recovery_ms = report.slowest_recovery_ms.max(ms(t.saturating_sub(f.healed)));
                    end.insert(target.to_owned(), t);
                }
                _ => report.violations.push(Finding {
                    rule: 4,
                    resource: None,
                    message: format!(
                        "fault {} ({}): no write through {target} stored within {} ms of the heal",
                        f.n, f.kind, input.info.liveness_bound_ms
                    ),
                    at: f.healed,
                    ids: vec![],
                }),
            }
        }
        // Its consequences may outlast the probes: writes given up on, or an instance's
        // flights, hold resources for a while after the heal.
        let lingers = f.healed + f.lingers_ms * 1_000_000;
        for e in end.values_mut() {
            *e = (*e).max(lingers);
        }
        // A stall the watch saw has no probes: its span and the linger are all there is.
        let fallback_end = if f.observed { lingers } else { (f.healed + bound).max(lingers) };
        out.push(Window {
            n: f.n,
            kind: f.kind.clone(),
            targets: f.targets.clone(),
            start: f.start,
            end,
            fallback_end,
        });
    }
    out
}

fn token(w: &Write) -> Option<u64> {
    w.token.as_deref()?.parse().ok()
}

fn store_order(input: &Input, classes: &[Class], report: &mut Report) {
    let by_id: HashMap<&str, usize> = input.writes.iter().enumerate().map(|(i, w)| (w.id.as_str(), i)).collect();
    let mut highest: HashMap<&str, (u64, &str)> = HashMap::new();
    for l in &input.landed {
        let group = input.group_of(&l.resource);
        *report.landed_by_group.entry(group.map_or("?".into(), |g| g.name.clone())).or_default() += 1;
        let sent = by_id.get(l.id.as_str()).map(|&i| (&input.writes[i], classes[i]));
        let problem = match sent {
            None => Some(format!("the store applied write {:?}, which no client sent", l.id)),
            Some((w, c)) if !(c.admitted() || c == Class::Unknown || c == Class::Undecided && !w.kind.admits()) => {
                Some(format!(
                    "the store applied write {} although its client was answered {} ({})",
                    w.id,
                    w.status,
                    c.word()
                ))
            }
            Some((w, _)) if w.token.as_deref() != Some(l.token.as_str()) => {
                Some(format!("write {} carried token {:?} but was admitted as {:?}", w.id, w.token, l.token))
            }
            _ => None,
        };
        if let Some(message) = problem {
            report.violations.push(Finding {
                rule: 1,
                resource: Some(l.resource.clone()),
                message,
                at: l.at,
                ids: vec![l.id.clone()],
            });
            continue;
        }
        let Ok(t) = l.token.parse::<u64>() else { continue };
        let before = highest.get(l.resource.as_str()).copied();
        match before {
            Some((h, id)) if t < h => {
                let finding = Finding {
                    rule: 1,
                    resource: Some(l.resource.clone()),
                    message: format!(
                        "{}: the store applied token {t} (write {}, #{}) after token {h} (write {id})",
                        l.resource, l.id, l.seq
                    ),
                    at: l.at,
                    ids: vec![id.to_owned(), l.id.clone()],
                };
                let late = by_id.get(l.id.as_str()).map(|&i| &input.writes[i]);
                let claimed = group.is_some_and(|g| g.claims_order);
                let graced = input.info.start_grace_ms > 0;
                let bound = input.info.apply_bound_ms * 1_000_000;
                let took = l.at.saturating_sub(l.received);
                if bound > 0 && l.received > 0 && took > bound {
                    let mut finding = finding;
                    finding.message += &format!(" (the store took {} ms to apply it)", ms(took));
                    report.bound_exceeded.push(finding);
                } else if claimed
                    && !graced
                    && !input.info.conditional
                    && late.is_some_and(|w| killed_in_flight(input, w))
                {
                    report.crash_hits.push(finding);
                } else if claimed {
                    report.violations.push(finding);
                } else {
                    report.window_hits.push(finding);
                }
            }
            Some((h, _)) if t == h => {}
            _ => {
                highest.insert(&l.resource, (t, &l.id));
            }
        }
    }
}

/// The write went through a gateway that the nemesis killed while it was in flight
/// (the client saw the connection die).
fn killed_in_flight(input: &Input, w: &Write) -> bool {
    let lost = matches!(w.error.as_deref(), Some(e) if e != "refused");
    lost && input.faults.iter().any(|f| {
        f.injected
            && f.kind.contains("gateway-kill")
            && f.targets.contains(&w.target)
            && f.start <= w.end
            && f.healed >= w.start
    })
}

fn linearizable(input: &Input, classes: &[Class], report: &mut Report) {
    let mut per_resource: BTreeMap<&str, Vec<(usize, Op)>> = BTreeMap::new();
    let mut envoy_refusals = Vec::new();
    for (i, w) in input.writes.iter().enumerate() {
        let Some(t) = token(w).filter(|_| w.kind.admits()) else { continue };
        if classes[i] == Class::Stale && w.target.starts_with("envoy") {
            // The filter refuses a token below its local copy of the mark without asking
            // etcd (docs/envoy.md): the refusal is right, but the mark it reports may be
            // behind etcd's. Checked on its own below, not as a register read. Its
            // ordering gate may also have refused it after etcd admitted it (overtaken
            // while it was held): its token may have been written.
            envoy_refusals.push(i);
            per_resource
                .entry(&w.resource)
                .or_default()
                .push((i, Op { token: t, answer: Answer::Unknown, start: w.start, end: w.end }));
            continue;
        }
        let answer = match classes[i] {
            c if c.admitted() => Answer::Admitted { advanced: None },
            Class::Stale => match w.highest.as_deref().and_then(|h| h.parse().ok()) {
                Some(mark) => Answer::Stale { mark },
                None => continue,
            },
            // Admitted (the mark may have advanced), never applied.
            Class::Undecided | Class::Unknown | Class::Conflict | Class::Lent => Answer::Unknown,
            _ => continue,
        };
        if matches!(answer, Answer::Stale { .. }) {
            // The gateway admits (advancing the mark) before its ordering gate, which may
            // then refuse the write as stale (docs/gateway.md, step 4): the refused token
            // may have been written.
            per_resource
                .entry(&w.resource)
                .or_default()
                .push((i, Op { token: t, answer: Answer::Unknown, start: w.start, end: w.end }));
        }
        per_resource.entry(&w.resource).or_default().push((i, Op { token: t, answer, start: w.start, end: w.end }));
    }
    envoy_copy_refusals(input, classes, &envoy_refusals, report);
    for (resource, ops) in per_resource {
        let history: Vec<Op> = ops.iter().map(|(_, op)| *op).collect();
        let final_mark = final_mark(input, resource).map(|m| m.and_then(|m| m.parse().ok()));
        if let Err(v) = max_register::check(&history, final_mark) {
            let ids: Vec<String> = v.ops.iter().map(|&k| input.writes[ops[k].0].id.clone()).collect();
            let at = v.ops.iter().map(|&k| ops[k].1.start).max().unwrap_or(0);
            report.violations.push(Finding {
                rule: 2,
                resource: Some(resource.to_owned()),
                message: v.message,
                at,
                ids,
            });
        }
    }
}

/// An Envoy refusal from its copy must be justified: the token is below the reported
/// mark, and an admit of that mark (or an unanswered one) began before the refusal
/// returned. Counted: those whose mark was already outdated when they began.
fn envoy_copy_refusals(input: &Input, classes: &[Class], refusals: &[usize], report: &mut Report) {
    let mut writers: HashMap<(&str, u64), u64> = HashMap::new();
    let mut acked: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for (i, w) in input.writes.iter().enumerate() {
        let Some(t) = token(w).filter(|_| w.kind.admits()) else { continue };
        // A write refused as stale may have written its token first: both hosts' gates
        // refuse an admitted write that a higher one overtook while it was held. A
        // conditional write refused for the store's version (409 "cannot write") was
        // admitted, and its token lent on the chain, whose highest an Envoy reports.
        let wrote =
            matches!(classes[i], Class::Undecided | Class::Unknown | Class::Stale | Class::Conflict | Class::Lent);
        if classes[i].admitted() || wrote {
            let first = writers.entry((&w.resource, t)).or_insert(w.start);
            *first = (*first).min(w.start);
        }
        if classes[i].admitted() {
            acked.entry(&w.resource).or_default().push((w.end, t));
        }
    }
    for &i in refusals {
        let w = &input.writes[i];
        let (Some(t), Some(mark)) = (token(w), w.highest.as_deref().and_then(|h| h.parse::<u64>().ok())) else {
            continue;
        };
        report.envoy_refusals.0 += 1;
        let justified = mark > t && writers.get(&(w.resource.as_str(), mark)).is_some_and(|&s| s <= w.end);
        if !justified {
            report.violations.push(Finding {
                rule: 2,
                resource: Some(w.resource.clone()),
                message: format!(
                    "{} refused token {t} reporting mark {mark}, which no admit that began before it wrote",
                    w.target
                ),
                at: w.start,
                ids: vec![w.id.clone()],
            });
        }
        let outdated =
            acked.get(w.resource.as_str()).is_some_and(|l| l.iter().any(|&(end, a)| end < w.start && a > mark));
        if outdated {
            report.envoy_refusals.1 += 1;
        }
    }
}

/// Each resource's mark at the end, from the last read-back of where it lives (etcd,
/// or the file-store gateway its group writes through); `None` when never read back.
fn final_mark<'a>(input: &'a Input, resource: &str) -> Option<Option<&'a str>> {
    let group = input.group_of(resource)?;
    let file = group.targets.iter().find(|t| input.info.targets.get(*t) == Some(&false));
    let source = file.map_or("etcd", String::as_str);
    let snap = input.snapshots.iter().rev().find(|s| s.after_fault.is_none() && s.source == source)?;
    Some(snap.marks.get(resource).map(String::as_str))
}

fn marks_kept(input: &Input, classes: &[Class], report: &mut Report) {
    // One sweep over the acknowledged admits by their end, the read-backs by their
    // start, not one pass over the writes per read-back: per read-back, the highest
    // token acknowledged before it on each resource (the first write to carry it)
    // among the writes whose marks it reads: every etcd-marked target's for `etcd`,
    // the one target's for a file-store gateway's.
    let mut acks: Vec<(usize, u64)> = input
        .writes
        .iter()
        .enumerate()
        .filter(|&(i, w)| classes[i].admitted() && w.kind.admits())
        .filter_map(|(i, w)| Some((i, token(w)?)))
        .collect();
    acks.sort_by_key(|&(i, _)| input.writes[i].end);
    let mut order: Vec<usize> = (0..input.snapshots.len()).collect();
    order.sort_by_key(|&s| input.snapshots[s].start);
    let raise = |best: &mut (u64, usize), t: u64, i: usize| {
        if t > best.0 || (t == best.0 && i < best.1) {
            *best = (t, i);
        }
    };
    let mut in_etcd: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
    let mut by_target: BTreeMap<(&str, &str), (u64, usize)> = BTreeMap::new();
    let mut findings: Vec<Vec<Finding>> = vec![Vec::new(); input.snapshots.len()];
    let mut next = 0;
    for s in order {
        let snap = &input.snapshots[s];
        while let Some(&(i, t)) = acks.get(next).filter(|&&(i, _)| input.writes[i].end < snap.start) {
            let w = &input.writes[i];
            if input.info.targets.get(&w.target).copied().unwrap_or(true) {
                raise(in_etcd.entry(&w.resource).or_insert((t, i)), t, i);
            }
            raise(by_target.entry((&w.target, &w.resource)).or_insert((t, i)), t, i);
            next += 1;
        }
        let acked: Vec<(&str, (u64, usize))> = if snap.source == "etcd" {
            in_etcd.iter().map(|(r, a)| (*r, *a)).collect()
        } else {
            by_target.iter().filter(|((target, _), _)| *target == snap.source).map(|((_, r), a)| (*r, *a)).collect()
        };
        for (resource, (t, i)) in acked {
            let id = &input.writes[i].id;
            let mark = snap.marks.get(resource).and_then(|m| m.parse::<u64>().ok());
            if mark.is_none_or(|m| m < t) {
                findings[s].push(Finding {
                    rule: 3,
                    resource: Some(resource.to_owned()),
                    message: format!(
                        "{resource}: {} read mark {:?} after fault {:?}, below token {t} acknowledged before (write {id})",
                        snap.source,
                        snap.marks.get(resource),
                        snap.after_fault
                    ),
                    at: snap.start,
                    ids: vec![id.to_owned()],
                });
            }
        }
    }
    report.violations.extend(findings.into_iter().flatten());
}

fn accounting(input: &Input, classes: &[Class], windows: &[Window], report: &mut Report) {
    let landings = landings(input, classes);
    for (i, w) in input.writes.iter().enumerate() {
        let c = classes[i];
        let expected = match w.kind {
            Kind::Missing => c == Class::Missing,
            Kind::Malformed => c == Class::Malformed,
            Kind::Trap => c == Class::Undecided,
            _ => matches!(c, Class::Stored | Class::Stale),
        };
        // A process holder's write left pending: the worker ended mid-write (killed by
        // the nemesis or at the end, or sent SIGTERM by its lock client on losing the lock).
        let ended_mid_write = w.end == u64::MAX && w.client.starts_with("proc");
        if expected || ended_mid_write {
            continue;
        }
        let explained = c.disturbed()
            && windows.iter().any(|win| {
                let end = win.end.get(&w.target).copied().unwrap_or(win.fallback_end);
                win.targets.contains(&w.target) && w.start <= end && w.end >= win.start
            });
        // Lends left by writes given up on outlast the fault that left them: any fault
        // before the write explains it.
        let explained = explained || (c == Class::Lent && windows.iter().any(|win| win.start <= w.start));
        // A conditional write refused for its version ("another write to the object
        // went first") is the answer to two writers at once: a paused holder writing on
        // while its successor writes explains it as well as a fault does.
        let explained = explained || (c == Class::Conflict && overlapped(input, w));
        // Or by a write the store applied late, past its fault's window, when it was the
        // last the store applied on the resource: the version it made is one the
        // fence never saw, and the next write there meets it, however much later.
        let explained = explained || (c == Class::Conflict && after_late_landing(&landings, w));
        if !explained {
            let why = if c == Class::Other {
                "an answer outside the contract".to_owned()
            } else {
                format!("no fault disturbing its target was active ({})", nearest(windows, w, input.info.start))
            };
            report.violations.push(Finding {
                rule: 5,
                resource: Some(w.resource.clone()),
                message: format!(
                    "write {} ({:?}, token {:?}) through {} was answered {} {} ({}): {why}; body {:?}",
                    w.id,
                    w.kind,
                    w.token,
                    w.target,
                    w.status,
                    w.error.as_deref().unwrap_or(""),
                    c.word(),
                    w.body
                ),
                at: w.start,
                ids: vec![w.id.clone()],
            });
        }
    }
}

/// Per resource, each write the store applied, in the order it applied them: when, and
/// whether late (its client was not told it was stored, or was told before it was).
fn landings<'a>(input: &'a Input, classes: &[Class]) -> HashMap<&'a str, Vec<(u64, bool)>> {
    let by_id: HashMap<&str, usize> = input.writes.iter().enumerate().map(|(i, w)| (w.id.as_str(), i)).collect();
    let mut out: HashMap<&str, Vec<(u64, bool)>> = HashMap::new();
    for l in &input.landed {
        let late = by_id.get(l.id.as_str()).is_none_or(|&i| classes[i] != Class::Stored || input.writes[i].end < l.at);
        out.entry(l.resource.as_str()).or_default().push((l.at, late));
    }
    for list in out.values_mut() {
        list.sort_by_key(|&(at, _)| at);
    }
    out
}

/// The last write the store applied on `w`'s resource before `w` was answered was a
/// late one ([`landings`]).
fn after_late_landing(landings: &HashMap<&str, Vec<(u64, bool)>>, w: &Write) -> bool {
    let Some(list) = landings.get(w.resource.as_str()) else { return false };
    let before = list.partition_point(|&(at, _)| at <= w.end);
    before > 0 && list[before - 1].1
}

/// Another client's write on `w`'s resource was in flight while `w` was.
fn overlapped(input: &Input, w: &Write) -> bool {
    input
        .writes
        .iter()
        .any(|o| o.resource == w.resource && o.client != w.client && o.start <= w.end && o.end >= w.start)
}

/// Where the write stood against the windows on its target: the last one that ended
/// before it began, and the next one to start after it, for the finding's reader.
fn nearest(windows: &[Window], w: &Write, run_start: u64) -> String {
    let on: Vec<(&Window, u64)> = windows
        .iter()
        .filter(|win| win.targets.contains(&w.target))
        .map(|win| (win, win.end.get(&w.target).copied().unwrap_or(win.fallback_end)))
        .collect();
    let secs = |t: u64| t.saturating_sub(run_start) as f64 / 1e9;
    let before = on.iter().filter(|(_, end)| *end < w.start).max_by_key(|(_, end)| *end);
    let after = on.iter().filter(|(win, _)| win.start > w.end).min_by_key(|(win, _)| win.start);
    let mut parts = vec![format!("it ran {:.1}-{:.1} s into the run", secs(w.start), secs(w.end))];
    if let Some((win, end)) = before {
        parts.push(format!("fault {} ({})'s window on {} ended at {:.1} s", win.n, win.kind, w.target, secs(*end)));
    }
    if let Some((win, _)) = after {
        parts.push(format!("fault {} ({}) began at {:.1} s", win.n, win.kind, secs(win.start)));
    }
    parts.join("; ")
}

/// The fault kind active at `at`, for the table's attribution of findings.
pub fn fault_at(input: &Input, at: u64) -> Option<String> {
    let bound = input.info.liveness_bound_ms * 1_000_000;
    input.faults.iter().rev().find(|f| f.injected && f.start <= at && at <= f.healed + bound).map(|f| f.kind.clone())
}
