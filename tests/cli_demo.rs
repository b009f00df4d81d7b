//! `ticketing demo`: a short run finds no safety violation, and its report
//! shows work done and stale writes refused.

mod cli;

use std::time::Duration;

use cli::ticketing;

/// The number at the end of the report line that starts with `label`
/// (after the indentation).
fn figure(report: &str, label: &str) -> u64 {
    let line = report
        .lines()
        .rev()
        .find(|l| {
            l.trim_start()
                .strip_prefix(label)
                .is_some_and(|rest| rest.starts_with(' '))
        })
        .unwrap_or_else(|| panic!("no `{label}` line in the report:\n{report}"));
    line.split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number at the end of {line:?}"))
}

#[test]
fn a_short_demo_finds_no_violation() {
    let f = ticketing(&["demo", "--secs", "3"], Duration::from_secs(60));
    assert_eq!(f.code, Some(0), "demo failed:\n{}\n{}", f.stdout, f.stderr);
    let report = &f.stdout;
    assert!(!f.stderr.contains("VIOLATION"), "{}", f.stderr);
    assert_eq!(figure(report, "violations"), 0, "{report}");
    assert!(figure(report, "acquire granted") > 0, "{report}");
    assert!(figure(report, "release released") > 0, "{report}");
    assert!(figure(report, "fenced writes") > 0, "{report}");
    assert!(figure(report, "stale writes refused") > 0, "{report}");
    // One leader crashed without handing its table over: a grace, and
    // still no violation.
    assert!(
        report.contains("without handing its table over") && report.contains("recovery grace"),
        "{report}"
    );
}
