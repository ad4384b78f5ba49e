//! Records the source commit and the wgpu version for `drama bench` reports.

/// The trimmed output of a successful git command.
fn git(args: &[&str]) -> Option<String> {
    std::process::Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    // A binary built from a working tree with uncommitted changes to tracked files is not the
    // commit it started from: its reports say so.
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(head) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{head}-dirty"),
            _ => head,
        },
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=DRAMA_COMMIT={commit}");
    // Look again whenever a source the binary is built from changes.
    for sources in [
        "../cli/src",
        "../engine/src",
        "../fixtures/src",
        "../graph/src",
        "../kernels-wgsl/src",
        "../server/src",
    ] {
        println!("cargo:rerun-if-changed={sources}");
    }
    let lock = std::fs::read_to_string("../Cargo.lock").unwrap_or_default();
    let wgpu = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"wgpu\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DRAMA_WGPU_VERSION={wgpu}");
    println!("cargo:rerun-if-changed=../Cargo.lock");
    println!("cargo:rerun-if-changed=../.git/HEAD");
    // A new commit moves the branch HEAD names, not HEAD itself.
    if let Some(branch) = std::fs::read_to_string("../.git/HEAD")
        .ok()
        .and_then(|head| head.strip_prefix("ref: ").map(|r| r.trim().to_string()))
    {
        println!("cargo:rerun-if-changed=../.git/{branch}");
    }
}
