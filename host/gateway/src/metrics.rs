//! The gateway's counters and latency histogram, rendered as Prometheus text.
//!
//! Hand-rolled: a dozen atomics and one fixed-bucket histogram do not justify a
//! metrics registry dependency.

use fencekeeper_core::Class;
use fencekeeper_engine::conditional;
use fencekeeper_engine::gate;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Everything the gateway counts.
#[derive(Default)]
pub struct Metrics {
    by_class: [AtomicU64; Class::ALL.len()],
    failed_open: AtomicU64,
    passthrough: AtomicU64,
    gate_waits: AtomicU64,
    gate_timeouts: AtomicU64,
    given_up: AtomicU64,
    start_grace: AtomicU64,
    upstream_errors: AtomicU64,
    too_large: AtomicU64,
    timed_out: AtomicU64,
    breaches: AtomicU64,
    audit_errors: AtomicU64,
    not_conditional: AtomicU64,
    version_refused: AtomicU64,
    precondition_failed: AtomicU64,
    compactions: AtomicU64,
    compaction_failures: AtomicU64,
    forgotten: AtomicU64,
    latency_buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
}

/// One counted event outside the fencing decision.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A request that is not fenced (a read, or outside the path prefix) was forwarded.
    Passthrough,
    /// An admitted write waited at the ordering gate for lower-token writes.
    GateWait,
    /// An admitted write waited at the gate past the gate timeout.
    GateTimeout,
    /// A forwarded write was given up on (upstream timeout, reset or failure after
    /// it was sent): it held its resource for the store apply bound.
    GivenUp,
    /// A fenced write arrived during the start grace and was refused (503).
    StartGrace,
    /// The upstream could not be reached, failed, or did not answer in time.
    UpstreamError,
    /// The request body exceeded the size limit.
    TooLarge,
    /// Reading the request body took longer than the request timeout.
    TimedOut,
    /// The validator gave a verdict the host proved wrong (refused).
    Breach,
    /// A mark's change could not be appended to the audit log.
    AuditError,
    /// Conditional writes: a write that cannot be made conditional was refused (501).
    NotConditional,
    /// Conditional writes: a write was refused by its version chain before it was sent
    /// (a version unknown or repeated, too many writes lent, the chain unavailable).
    VersionRefused,
    /// Conditional writes: the store refused a write's precondition (412).
    PreconditionFailed,
}

impl From<gate::Event> for Event {
    fn from(event: gate::Event) -> Event {
        match event {
            gate::Event::Waited => Event::GateWait,
            gate::Event::TimedOut => Event::GateTimeout,
            gate::Event::GivenUp => Event::GivenUp,
            gate::Event::StartGrace => Event::StartGrace,
        }
    }
}

impl From<conditional::Event> for Event {
    fn from(event: conditional::Event) -> Event {
        match event {
            conditional::Event::NotConditional => Event::NotConditional,
            conditional::Event::TooLarge => Event::TooLarge,
            conditional::Event::VersionRefused => Event::VersionRefused,
            conditional::Event::PreconditionFailed => Event::PreconditionFailed,
        }
    }
}

impl Metrics {
    /// Count a fencing outcome; `forwarded` without an admit is a fail-open pass.
    pub fn outcome(&self, class: Class, forwarded: bool) {
        self.by_class[class.index()].fetch_add(1, Relaxed);
        if forwarded && class != Class::Admitted {
            self.failed_open.fetch_add(1, Relaxed);
        }
    }

    /// Count an event.
    pub fn event(&self, event: Event) {
        let counter = match event {
            Event::Passthrough => &self.passthrough,
            Event::GateWait => &self.gate_waits,
            Event::GateTimeout => &self.gate_timeouts,
            Event::GivenUp => &self.given_up,
            Event::StartGrace => &self.start_grace,
            Event::UpstreamError => &self.upstream_errors,
            Event::TooLarge => &self.too_large,
            Event::TimedOut => &self.timed_out,
            Event::Breach => &self.breaches,
            Event::AuditError => &self.audit_errors,
            Event::NotConditional => &self.not_conditional,
            Event::VersionRefused => &self.version_refused,
            Event::PreconditionFailed => &self.precondition_failed,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// Count one periodic compaction (`--compact-idle-for`): the marks it forgot, or
    /// `None` when it failed (and forgot nothing).
    pub fn compaction(&self, forgotten: Option<usize>) {
        match forgotten {
            Some(n) => {
                self.compactions.fetch_add(1, Relaxed);
                self.forgotten.fetch_add(n as u64, Relaxed);
            }
            None => {
                self.compaction_failures.fetch_add(1, Relaxed);
            }
        }
    }

    /// Record how long one request took, from its arrival to its response head.
    pub fn latency(&self, took: Duration) {
        let secs = took.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.latency_buckets[i].fetch_add(1, Relaxed);
        }
        self.latency_count.fetch_add(1, Relaxed);
        self.latency_sum_micros.fetch_add(took.as_micros() as u64, Relaxed);
    }

    /// How many outcomes of `class` were counted.
    pub fn count(&self, class: Class) -> u64 {
        self.by_class[class.index()].load(Relaxed)
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, samples: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let labels: Vec<String> = Class::ALL.iter().map(|c| format!("{{class=\"{}\"}}", c.name())).collect();
        let by_class: Vec<(&str, u64)> =
            labels.iter().zip(&self.by_class).map(|(l, v)| (l.as_str(), v.load(Relaxed))).collect();
        counter(
            "fencekeeper_gateway_requests_total",
            "Fenced requests by outcome class (admitted, stale, replayed, malformed, missing, undecided, unverified).",
            &by_class,
        );
        let simple = [
            (
                "fencekeeper_gateway_failed_open_total",
                "Requests passed without an admit (efficiency mode).",
                &self.failed_open,
            ),
            (
                "fencekeeper_gateway_passthrough_total",
                "Requests forwarded unfenced (not a fenced method or path).",
                &self.passthrough,
            ),
            (
                "fencekeeper_gateway_gate_waits_total",
                "Admitted writes that waited for lower-token writes in flight.",
                &self.gate_waits,
            ),
            (
                "fencekeeper_gateway_gate_timeouts_total",
                "Admitted writes that waited at the gate past --gate-timeout.",
                &self.gate_timeouts,
            ),
            (
                "fencekeeper_gateway_gate_given_up_total",
                "Forwarded writes given up on after they may have been sent; each held its resource for --store-apply-bound.",
                &self.given_up,
            ),
            (
                "fencekeeper_gateway_start_grace_total",
                "Fenced writes refused (503) during the start grace (--start-grace).",
                &self.start_grace,
            ),
            (
                "fencekeeper_gateway_upstream_errors_total",
                "Forwarded requests the upstream failed or did not answer in time.",
                &self.upstream_errors,
            ),
            (
                "fencekeeper_gateway_too_large_total",
                "Requests refused with 413 (body over --max-body).",
                &self.too_large,
            ),
            (
                "fencekeeper_gateway_timed_out_total",
                "Requests whose body did not arrive within --request-timeout.",
                &self.timed_out,
            ),
            (
                "fencekeeper_gateway_contract_breaches_total",
                "Verdicts the gateway proved wrong (a validator guest breaking the contract); each refused.",
                &self.breaches,
            ),
            (
                "fencekeeper_gateway_audit_errors_total",
                "Mark changes that could not be appended to the --audit log (each logged at error).",
                &self.audit_errors,
            ),
            (
                "fencekeeper_gateway_not_conditional_total",
                "Writes refused (501) because they cannot be made conditional (--conditional-writes).",
                &self.not_conditional,
            ),
            (
                "fencekeeper_gateway_version_refused_total",
                "Conditional writes refused by their version chain before they were sent.",
                &self.version_refused,
            ),
            (
                "fencekeeper_gateway_precondition_failed_total",
                "Conditional writes whose precondition the store refused (412).",
                &self.precondition_failed,
            ),
            (
                "fencekeeper_gateway_compactions_total",
                "Periodic compactions that ran (--compact-idle-for).",
                &self.compactions,
            ),
            (
                "fencekeeper_gateway_compaction_failures_total",
                "Periodic compactions that failed and forgot nothing (each logged at error).",
                &self.compaction_failures,
            ),
            (
                "fencekeeper_gateway_marks_forgotten_total",
                "Marks the periodic compactions forgot under the retention floor.",
                &self.forgotten,
            ),
        ];
        for (name, help, value) in simple {
            counter(name, help, &[("", value.load(Relaxed))]);
        }
        let name = "fencekeeper_gateway_request_duration_seconds";
        let _ =
            writeln!(out, "# HELP {name} Time from a request's arrival to its response head.\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(&self.latency_buckets) {
            cumulative += count.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let total = self.latency_count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let _ = writeln!(out, "{name}_sum {}", self.latency_sum_micros.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {total}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_counts_refusals_by_class_and_buckets_cumulatively() {
        let m = Metrics::default();
        m.outcome(Class::Stale, false);
        m.outcome(Class::Undecided, true);
        m.outcome(Class::Unverified, false);
        m.compaction(Some(3));
        m.compaction(None);
        m.latency(Duration::from_micros(700));
        m.latency(Duration::from_millis(20));
        let text = m.render();
        assert!(text.contains("fencekeeper_gateway_requests_total{class=\"stale\"} 1"), "{text}");
        assert!(text.contains("fencekeeper_gateway_failed_open_total 1"));
        assert!(text.contains("fencekeeper_gateway_requests_total{class=\"unverified\"} 1"), "{text}");
        assert!(text.contains("fencekeeper_gateway_request_duration_seconds_bucket{le=\"0.001\"} 1"));
        assert!(text.contains("fencekeeper_gateway_request_duration_seconds_bucket{le=\"0.025\"} 2"));
        assert!(text.contains("fencekeeper_gateway_request_duration_seconds_count 2"));
        assert!(text.contains("fencekeeper_gateway_compactions_total 1"), "{text}");
        assert!(text.contains("fencekeeper_gateway_compaction_failures_total 1"), "{text}");
        assert!(text.contains("fencekeeper_gateway_marks_forgotten_total 3"), "{text}");
    }
}
