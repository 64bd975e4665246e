//! A picture of a finding: one timeline of the resource around it. Time runs left to
//! right, tokens bottom to top (ranked: etcd revisions jump). Each write a client sent
//! is a bar from its start to its end at its token's height: green when stored, red
//! when refused as stale, orange when undecided or unanswered. Each write the store
//! applied is a blue dot at the moment it landed, numbered in arrival order; the
//! writes named by the finding are circled. Faults are shaded, with their kind.

use crate::check::{classify, rules::Finding, Class, Input};
use crate::record::{Landed, Write};
use std::fmt::Write as _;

const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 90.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 90.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The writes and landings on the finding's resource within `span` ns of it.
pub fn window<'a>(input: &'a Input, finding: &Finding, span: u64) -> (Vec<&'a Write>, Vec<&'a Landed>) {
    let (from, to) = (finding.at.saturating_sub(span), finding.at.saturating_add(span));
    let resource = finding.resource.as_deref().unwrap_or_default();
    let writes =
        input.writes.iter().filter(|w| w.resource == resource && w.end.min(to) >= from && w.start <= to).collect();
    let landed = input.landed.iter().filter(|l| l.resource == resource && l.at >= from && l.at <= to).collect();
    (writes, landed)
}

/// The SVG picture of `finding` over `span` ns either side.
pub fn draw(input: &Input, finding: &Finding, span: u64) -> String {
    let (writes, landed) = window(input, finding, span);
    let (from, to) = (finding.at.saturating_sub(span), finding.at.saturating_add(span));
    let mut tokens: Vec<u64> = writes
        .iter()
        .filter_map(|w| w.token.as_deref()?.parse().ok())
        .chain(landed.iter().filter_map(|l| l.token.parse().ok()))
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    let x = |t: u64| LEFT + (t.clamp(from, to) - from) as f64 / (to - from).max(1) as f64 * (WIDTH - LEFT - 20.0);
    let rows = tokens.len().max(1) as f64;
    let y = |token: u64| {
        let rank = tokens.iter().position(|&t| t == token).unwrap_or(0) as f64;
        HEIGHT - BOTTOM - (rank + 0.5) / rows * (HEIGHT - TOP - BOTTOM)
    };
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="monospace" font-size="11"><rect width="100%" height="100%" fill="white"/>"#
    );
    let _ = write!(
        svg,
        r#"<text x="10" y="18" font-size="13" font-weight="bold">rule {}: {}</text><text x="10" y="36">{}</text>"#,
        finding.rule,
        escape(finding.resource.as_deref().unwrap_or("")),
        escape(&finding.message.chars().take(170).collect::<String>())
    );
    for f in input.faults.iter().filter(|f| f.injected && f.healed >= from && f.start <= to) {
        let (a, b) = (x(f.start), x(f.healed));
        let _ = write!(
            svg,
            r##"<rect x="{a:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f4c7c3" opacity="0.6"/><text x="{a:.1}" y="{:.1}" fill="#a33">{} #{}</text>"##,
            (b - a).max(1.0),
            HEIGHT - TOP - BOTTOM,
            HEIGHT - BOTTOM + 14.0,
            escape(&f.kind),
            f.n
        );
    }
    let mut tick = from - from % 1_000_000_000 + 1_000_000_000;
    while tick < to {
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#ccc"/><text x="{0:.1}" y="{3:.1}" fill="#777" font-size="9">{4:+.1} s</text>"##,
            x(tick),
            TOP,
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 26.0,
            (tick as f64 - finding.at as f64) / 1e9
        );
        tick += 1_000_000_000;
    }
    for &t in &tokens {
        let _ = write!(svg, r##"<text x="4" y="{:.1}" fill="#555">{t}</text>"##, y(t) + 4.0);
    }
    for w in &writes {
        let Some(t) = w.token.as_deref().and_then(|t| t.parse().ok()) else { continue };
        let color = match classify(w) {
            Class::Stored => "#2a2",
            Class::Stale => "#d22",
            c if c.disturbed() => "#e90",
            _ => "#888",
        };
        let width = if finding.ids.contains(&w.id) { 5 } else { 2 };
        let _ = write!(
            svg,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="{width}"><title>{} {} via {} -> {} {}</title></line>"#,
            x(w.start),
            y(t),
            x(w.end).max(x(w.start) + 1.5),
            y(t),
            escape(&w.id),
            t,
            escape(&w.target),
            w.status,
            escape(w.error.as_deref().unwrap_or(""))
        );
    }
    for l in &landed {
        let Ok(t) = l.token.parse::<u64>() else { continue };
        let (cx, cy) = (x(l.at), y(t));
        let _ = write!(
            svg,
            r##"<circle cx="{cx:.1}" cy="{cy:.1}" r="4" fill="#24d"><title>#{} {} token {t} via {}</title></circle>"##,
            l.seq,
            escape(&l.id),
            escape(&l.target)
        );
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" fill="#24d" font-size="9">#{}</text>"##,
            cx + 5.0,
            cy - 5.0,
            l.seq
        );
        if finding.ids.contains(&l.id) {
            let _ =
                write!(svg, r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="9" fill="none" stroke="black" stroke-width="2"/>"#);
        }
    }
    let legend_y = HEIGHT - 30.0;
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><text x="{LEFT}" y="{legend_y}">time -> ({} ms shown)   token ^   <tspan fill="#2a2">stored</tspan>  <tspan fill="#d22">stale (409)</tspan>  <tspan fill="#e90">undecided / no answer</tspan>  <tspan fill="#24d">o landed in the store (#arrival)</tspan>  <tspan fill="#a33">fault</tspan>  thick / circled: named by the finding</text></svg>"##,
        HEIGHT - BOTTOM,
        WIDTH - 20.0,
        HEIGHT - BOTTOM,
        (to - from) / 1_000_000
    );
    svg
}
