//! The conformance vectors against the native core and the wasm component, and the
//! two against each other: on every vector and on thousands of random inputs, the
//! component must answer exactly what the core answers natively.
//!
//! The component is loaded from guest/artifacts, or from `FENCEKEEPER_GUEST_DIR`
//! when that is set (a fresh guest build from the fallback toolchain, see
//! scripts/build-guests.sh).
//!
//! The WIT verdict carries a malformed reason as text: the host keeps the guest's
//! own reason, so native and wasm agree on it too (both are the core's words).

use fencekeeper::conformance::{self, Vectors};
use fencekeeper::validator::{guest_path, GuestSource, Limits, LoadError, Validator, VALIDATOR_FILE};
use fencekeeper::{Decider, Mode, NativeDecider, Policy, Token};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use std::sync::OnceLock;

/// The validator component under test.
fn load_wasm(policy: Policy) -> Result<Validator, LoadError> {
    Validator::load(GuestSource::Path(&guest_path(VALIDATOR_FILE)), policy, Limits::default())
}

fn vectors() -> Vectors {
    Vectors::bundled().expect("the bundled vectors parse")
}

#[test]
fn every_vector_passes_against_the_native_core() {
    let report = conformance::run(&vectors(), |p| Ok::<_, String>(NativeDecider(p)));
    assert_eq!(report.failed(), 0, "\n{report}");
}

#[test]
fn every_vector_passes_against_the_wasm_component() {
    let report = conformance::run(&vectors(), load_wasm);
    assert_eq!(report.failed(), 0, "\n{report}");
}

#[test]
fn native_and_wasm_give_identical_verdicts_on_every_vector() {
    let vectors = vectors();
    let native = conformance::run(&vectors, |p| Ok::<_, String>(NativeDecider(p)));
    let wasm = conformance::run(&vectors, load_wasm);
    assert_eq!(native.outcomes.len(), vectors.len());
    for (n, w) in native.outcomes.iter().zip(&wasm.outcomes) {
        assert_eq!(n.verdict, w.verdict, "vector {:?}", n.name);
    }
}

/// One wasm validator per policy, shared by the property test's cases.
fn wasm_for(strict: bool) -> &'static Validator {
    static LAX: OnceLock<Validator> = OnceLock::new();
    static STRICT: OnceLock<Validator> = OnceLock::new();
    let cell = if strict { &STRICT } else { &LAX };
    cell.get_or_init(|| load_wasm(Policy { mode: Mode::Correctness, strict }).expect("load the wasm validator"))
}

/// Token text: well-formed tokens of 1 to 5 components (some with leading zeros or
/// near u64::MAX), and arbitrary short strings over digits, dots and troublemakers.
fn token_text() -> impl Strategy<Value = String> {
    let component = prop_oneof![
        (0u64..50).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..50).prop_map(|n| format!("000{n}")),
        Just("18446744073709551616".to_owned()),
    ];
    prop_oneof![
        proptest::collection::vec(component, 1..=5).prop_map(|c| c.join(".")),
        "[0-9. +\\-x_,e]{0,24}",
        ".{0,12}",
    ]
}

fn mark() -> impl Strategy<Value = Option<Token>> {
    let parts = (1usize..=4).prop_flat_map(|n| proptest::collection::vec(prop_oneof![0u64..50, any::<u64>()], n));
    proptest::option::weighted(0.8, parts.prop_map(|p| Token::from_parts(&p).expect("1 to 4 components")))
}

/// Token text next to the mark, where the decision flips: the mark itself (plain
/// and with leading zeros) and its last component plus or minus one.
fn near(mark: &Token) -> impl Strategy<Value = String> {
    let parts = mark.parts().to_vec();
    (0u8..4).prop_map(move |k| {
        let mut p: Vec<String> = parts.iter().map(u64::to_string).collect();
        let last = parts[parts.len() - 1];
        let n = p.len() - 1;
        match k {
            0 => {}
            1 => p[0] = format!("00{}", p[0]),
            // Past u64::MAX this is an overflow: malformed, as it should be.
            2 => p[n] = (u128::from(last) + 1).to_string(),
            _ => p[n] = last.saturating_sub(1).to_string(),
        }
        p.join(".")
    })
}

/// One decision to make: (strict, presented, mark). Resource keys never reach a
/// decider (the guard checks them), so they are not part of a case.
type Case = (bool, Option<String>, Option<Token>);

fn case() -> impl Strategy<Value = Case> {
    (any::<bool>(), mark()).prop_flat_map(|(strict, mark)| {
        let presented = match mark {
            Some(m) => prop_oneof![token_text(), near(&m)].boxed(),
            None => token_text().boxed(),
        };
        (Just(strict), proptest::option::weighted(0.95, presented), Just(mark))
    })
}

#[test]
fn random_inputs_reach_every_verdict() {
    // Otherwise the agreement below could hold on malformed input alone.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = case();
    let mut seen = std::collections::HashMap::new();
    for _ in 0..4000 {
        let (strict, presented, mark) = strategy.new_tree(&mut runner).expect("generate").current();
        let verdict = NativeDecider(Policy { mode: Mode::Correctness, strict })
            .decide(presented.as_deref(), mark.as_ref())
            .expect("native always decides");
        *seen.entry(conformance::Kind::of(&verdict)).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 5, "verdict kinds reached: {seen:?}");
    assert!(seen.values().all(|n| *n >= 20), "verdict kinds reached: {seen:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn native_and_wasm_agree_on_random_inputs((strict, presented, mark) in case()) {
        let native = NativeDecider(Policy { mode: Mode::Correctness, strict });
        let n = native.decide(presented.as_deref(), mark.as_ref()).expect("native always decides");
        let w = wasm_for(strict).decide(presented.as_deref(), mark.as_ref());
        prop_assert_eq!(Ok(n), w.map_err(|e| e.to_string()));
    }
}
