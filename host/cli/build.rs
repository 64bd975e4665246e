//! Records the commit the binary is built from, for `fencekeeper --version`.

use std::path::Path;
use std::process::Command;

fn main() {
    let git = Path::new("../../.git");
    // Rebuilt when the checkout moves to another commit: HEAD, the branch it names,
    // or the packed refs.
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/packed-refs");
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=../../.git/{reference}");
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown (not built from a git checkout)".to_owned());
    println!("cargo:rustc-env=FENCEKEEPER_COMMIT={commit}");
}
