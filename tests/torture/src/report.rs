//! What a checked run prints and leaves behind: the summary, the table of faults, and
//! for each finding its history window (`findings/N.jsonl`) and its picture
//! (`findings/N.svg`).

use crate::check::rules::{fault_at, Finding, Report};
use crate::check::Input;
use crate::record::Log;
use crate::svg;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

/// Findings while no fault was active (or within the liveness bound after one).
const NONE: &str = "(no fault active)";
/// Pictures drawn per kind of finding, at most.
const PICTURES: usize = 10;
/// The history window around a finding, either side.
const SPAN: u64 = 3_000_000_000;

/// Print the report; write the findings' windows and pictures under `dir/findings`.
pub fn write(dir: &Path, input: &Input, report: &Report) -> Result<()> {
    let seconds = (input.info.end.saturating_sub(input.info.start)) as f64 / 1e9;
    println!("== torture: seed {} ({} s of load)", input.info.seed, seconds.round());
    println!(
        "writes checked      {} ({:.0}/s), {} applied by the store",
        report.writes,
        report.writes as f64 / seconds.max(1.0),
        report.landed
    );
    let classes: Vec<String> = report.classes.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("answers             {}", classes.join(", "));
    println!(
        "slowest recovery    {} ms after a heal (bound {} ms)",
        report.slowest_recovery_ms, input.info.liveness_bound_ms
    );
    println!(
        "envoy refusals      {} answered from the filter's copy of the marks; {} reported a mark already outdated",
        report.envoy_refusals.0, report.envoy_refusals.1
    );
    println!(
        "gateway refusals    {} (each may have advanced the mark to its own token before the gate refused it)",
        report.gate_refusals
    );
    let observed: Vec<_> = input.faults.iter().filter(|f| f.observed).collect();
    let unplanned = observed
        .iter()
        .filter(|o| !input.faults.iter().any(|f| !f.observed && f.start <= o.healed && o.start <= f.healed))
        .count();
    println!(
        "stall watch         {} stalls seen, {unplanned} of them outside every injected fault (the observed- rows)",
        observed.len()
    );
    let attribute = |list: &[Finding]| {
        let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
        for f in list {
            *by_kind.entry(fault_at(input, f.at).unwrap_or_else(|| NONE.into())).or_default() += 1;
        }
        by_kind
    };
    let (violations, hits_by_kind, crashes, exceeded) = (
        attribute(&report.violations),
        attribute(&report.window_hits),
        attribute(&report.crash_hits),
        attribute(&report.bound_exceeded),
    );
    println!(
        "| fault kind | injected | not injected | violations | window hits (unclaimed) | crash hits (claimed) | bound exceeded |"
    );
    let count = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    for (kind, (yes, no)) in &report.faults {
        let (v, h, c, x) =
            (count(&violations, kind), count(&hits_by_kind, kind), count(&crashes, kind), count(&exceeded, kind));
        println!("| {kind} | {yes} | {no} | {v} | {h} | {c} | {x} |");
    }
    let (v, h, c, x) =
        (count(&violations, NONE), count(&hits_by_kind, NONE), count(&crashes, NONE), count(&exceeded, NONE));
    println!("| {NONE} | | | {v} | {h} | {c} | {x} |");
    let mut hits: BTreeMap<String, u64> = BTreeMap::new();
    for h in &report.window_hits {
        let group = h.resource.as_deref().and_then(|r| input.group_of(r)).map_or("?".into(), |g| g.name.clone());
        *hits.entry(group).or_default() += 1;
    }
    println!("store order, per group (claimed: a breach is a violation; unclaimed: a window hit):");
    for g in &input.info.groups {
        let landed = report.landed_by_group.get(&g.name).copied().unwrap_or(0);
        let hit = hits.get(&g.name).copied().unwrap_or(0);
        let claimed = if g.claims_order { "claimed  " } else { "unclaimed" };
        let rate = if landed > 0 { hit as f64 * 1e6 / landed as f64 } else { 0.0 };
        println!(
            "  {:<14} {claimed} via {:<28} {landed:>7} applied, {hit} out of order ({rate:.0} per million)",
            g.name,
            g.targets.join(",")
        );
    }
    let findings = dir.join("findings");
    let found = [&report.violations, &report.window_hits, &report.crash_hits, &report.bound_exceeded];
    if found.iter().any(|list| !list.is_empty()) {
        std::fs::create_dir_all(&findings)?;
    }
    println!(
        "gateway crashes     {} claimed-group writes landed out of order after their gateway was killed with them in flight",
        report.crash_hits.len()
    );
    println!(
        "bound exceeded      {} writes landed out of order after the store took longer than the store apply bound \
         ({} ms) to apply them",
        report.bound_exceeded.len(),
        input.info.apply_bound_ms
    );
    for (prefix, list) in [
        ("violation", &report.violations),
        ("crash-hit", &report.crash_hits),
        ("window-hit", &report.window_hits),
        ("bound-exceeded", &report.bound_exceeded),
    ] {
        for (i, f) in list.iter().enumerate() {
            if i < 20 || prefix == "violation" && i < 200 {
                println!("{prefix} (rule {}): {}", f.rule, f.message);
            }
            if i < PICTURES && f.resource.is_some() {
                save(&findings, &format!("{prefix}-{i}"), input, f)?;
            }
        }
    }
    let kinds = report.faults.len();
    let injected: u64 = report.faults.values().map(|(y, _)| y).sum();
    let envoy_landed: u64 = input
        .info
        .groups
        .iter()
        .filter(|g| g.targets.iter().any(|t| t.starts_with("envoy")))
        .map(|g| report.landed_by_group.get(&g.name).copied().unwrap_or(0))
        .sum();
    let envoy_hits: u64 = input
        .info
        .groups
        .iter()
        .filter(|g| g.targets.iter().any(|t| t.starts_with("envoy")))
        .map(|g| hits.get(&g.name).copied().unwrap_or(0))
        .sum();
    println!(
        "torture: {} writes checked ({:.0}/s), {injected} faults of {kinds} kinds, {} violations, {} window hits where not claimed (Envoy: {envoy_hits} of {envoy_landed} applied), {} landings past the store apply bound{}",
        report.writes,
        report.writes as f64 / seconds.max(1.0),
        report.violations.len(),
        report.window_hits.len(),
        report.bound_exceeded.len(),
        if report.violations.is_empty() && report.window_hits.is_empty() { String::new() } else { format!("; see {}", findings.display()) }
    );
    Ok(())
}

fn save(dir: &Path, name: &str, input: &Input, finding: &Finding) -> Result<()> {
    std::fs::write(dir.join(format!("{name}.svg")), svg::draw(input, finding, SPAN))?;
    let (writes, landed) = svg::window(input, finding, SPAN);
    let log = Log::append(&dir.join(format!("{name}.jsonl")), false)?;
    log.write(&serde_json::json!({ "finding": finding.message, "rule": finding.rule, "at": finding.at }))?;
    for w in writes {
        log.write(&serde_json::json!({ "write": w }))?;
    }
    for l in landed {
        log.write(&serde_json::json!({ "landed": l }))?;
    }
    for f in input.faults.iter().filter(|f| f.start <= finding.at + SPAN && f.healed + SPAN >= finding.at) {
        log.write(&serde_json::json!({ "fault": f }))?;
    }
    log.flush()
}
