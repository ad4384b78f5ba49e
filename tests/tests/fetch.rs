//! `drama fetch` end to end against a fake hub on 127.0.0.1 serving a generated checkpoint
//! under the pinned name: success, a download cut off midway, a fetch killed midway, a wrong
//! revision, a commit other than the pin, a tampered file, an existing modified directory,
//! and valid checkpoints at the target that this pin did not fetch.

use std::path::{Path, PathBuf};
use std::process::Command;

use drama_checkpoint::{PINNED_REPO, PINNED_REVISION};
use drama_tests::drama_binary;
use drama_tests::fake_hub::{FakeHub, Fault};

struct Setup {
    _root: tempfile::TempDir,
    source: PathBuf,
    work: PathBuf,
    home: PathBuf,
}

fn setup() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let source = root.path().join("source");
    drama_fixtures::write_preset("tiny", 11, &source).unwrap();
    let work = root.path().join("work");
    let home = root.path().join("hf-home");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    Setup {
        source,
        work,
        home,
        _root: root,
    }
}

/// `drama fetch --dir <dir>` against `hub`, not started yet.
fn fetch_command(setup: &Setup, hub: &FakeHub, dir: &Path) -> Command {
    let mut command = Command::new(drama_binary());
    command
        .args(["fetch", "--dir", dir.to_str().unwrap()])
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HOME", &setup.home)
        .env_remove("HF_TOKEN")
        .env("NO_PROXY", "127.0.0.1");
    command
}

/// Runs `drama fetch --dir <dir>` against `hub`; returns (exit code, stdout, stderr).
fn fetch(setup: &Setup, hub: &FakeHub, dir: &Path) -> (Option<i32>, String, String) {
    let out = fetch_command(setup, hub, dir).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn leftovers(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn fetch_downloads_verifies_and_labels_pinned() {
    let s = setup();
    let hub = FakeHub::start(&s.source, PINNED_REPO, PINNED_REVISION, Fault::None);
    let target = s.work.join("ckpt");
    let (code, stdout, stderr) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stdout.contains("downloaded and verified"), "{stdout}");
    assert!(
        stdout.contains(&format!("pinned {PINNED_REPO}@{PINNED_REVISION}")),
        "{stdout}"
    );
    for name in leftovers(&s.source) {
        let a = std::fs::read(s.source.join(&name)).unwrap();
        let b = std::fs::read(target.join(&name)).unwrap();
        assert!(a == b, "{name} differs after download");
    }
    assert_eq!(
        leftovers(&s.work),
        vec!["ckpt".to_string()],
        "staging directory left behind"
    );
    // A second fetch finds the complete directory and downloads nothing.
    let (code, stdout, _) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("already present, verified"), "{stdout}");
}

/// A failed download leaves nothing: no partial checkpoint, no staging directory, and none of
/// the directories the fetch created to hold its target.
#[test]
fn a_download_cut_off_midway_leaves_nothing_behind() {
    let s = setup();
    let hub = FakeHub::start(
        &s.source,
        PINNED_REPO,
        PINNED_REVISION,
        Fault::CutOff("model-00001-of-00002.safetensors".into()),
    );
    // Into directories that do not exist yet: they go too.
    let target = s.work.join("a").join("b").join("ckpt");
    let (code, _, stderr) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(1), "a truncated download was accepted");
    assert!(stderr.contains("model-00001-of-00002.safetensors"), "{stderr}");
    assert!(!target.exists(), "a partial checkpoint was left at the target");
    assert!(
        leftovers(&s.work).is_empty(),
        "staging left behind: {:?}",
        leftovers(&s.work)
    );
}

/// A fetch killed midway (SIGKILL: no chance to clean up) leaves its staging directory; the
/// next fetch to the same target removes it, and one left by an older version (no lock
/// file), but not one whose lock a running fetch holds, and succeeds.
#[test]
fn a_killed_fetch_is_cleaned_up_by_the_next() {
    let s = setup();
    let target = s.work.join("ckpt");
    let stalling = FakeHub::start(
        &s.source,
        PINNED_REPO,
        PINNED_REVISION,
        Fault::Stalls("model-00001-of-00002.safetensors".into()),
    );
    let mut killed = fetch_command(&s, &stalling, &target)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !stalling.stalled() {
        assert!(start.elapsed().as_secs() < 120, "the download never reached the stall");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    killed.kill().unwrap();
    killed.wait().unwrap();
    let stem = format!(".ckpt.fetch-{}", killed.id());
    assert_eq!(leftovers(&s.work), [stem.clone(), format!("{stem}.lock")]);
    // A running fetch's staging (its lock held, here by this test) and an older version's.
    let live = s.work.join(".ckpt.fetch-1");
    std::fs::create_dir_all(live.join("checkpoint")).unwrap();
    let lock = std::fs::File::create(s.work.join(".ckpt.fetch-1.lock")).unwrap();
    lock.lock().unwrap();
    std::fs::create_dir_all(s.work.join(".ckpt.fetch-2/checkpoint")).unwrap();
    let hub = FakeHub::start(&s.source, PINNED_REPO, PINNED_REVISION, Fault::None);
    let (code, _, stderr) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(leftovers(&s.work), [".ckpt.fetch-1", ".ckpt.fetch-1.lock", "ckpt"]);
}

#[test]
fn a_wrong_revision_is_refused() {
    let s = setup();
    let other = "0".repeat(40);
    let hub = FakeHub::start(&s.source, PINNED_REPO, &other, Fault::None);
    let target = s.work.join("ckpt");
    let (code, _, stderr) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(1));
    assert!(stderr.contains(PINNED_REVISION), "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");
    assert!(!target.exists());
}

#[test]
fn a_hub_serving_another_commit_is_refused() {
    let s = setup();
    let hub = FakeHub::start(
        &s.source,
        PINNED_REPO,
        PINNED_REVISION,
        Fault::ServesCommit("f".repeat(40)),
    );
    let target = s.work.join("ckpt");
    let (code, _, stderr) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(&"f".repeat(40)) && stderr.contains("not the pinned commit"),
        "{stderr}"
    );
    assert!(!target.exists());
}

#[test]
fn a_tampered_file_is_refused_and_deleted() {
    let s = setup();
    let hub = FakeHub::start(
        &s.source,
        PINNED_REPO,
        PINNED_REVISION,
        Fault::Tampered("config.json".into()),
    );
    let target = s.work.join("ckpt");
    let (code, _, stderr) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("config.json") && stderr.contains("does not match SHA256SUMS"),
        "{stderr}"
    );
    assert!(!target.exists());
    assert!(leftovers(&s.work).is_empty());
}

#[test]
fn an_existing_modified_directory_is_refused_not_repaired() {
    let s = setup();
    let hub = FakeHub::start(&s.source, PINNED_REPO, PINNED_REVISION, Fault::None);
    let target = s.work.join("ckpt");
    assert_eq!(fetch(&s, &hub, &target).0, Some(0));
    let tokenizer = target.join("tokenizer.json");
    std::fs::write(&tokenizer, "{}").unwrap();
    let (code, _, stderr) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("not repaired") && stderr.contains("tokenizer.json"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&tokenizer).unwrap(),
        "{}",
        "the directory was modified"
    );
}

#[test]
fn a_valid_checkpoint_not_fetched_from_the_pin_is_not_labelled_pinned() {
    let s = setup();
    let hub = FakeHub::start(&s.source, PINNED_REPO, PINNED_REVISION, Fault::None);
    // A generated checkpoint placed at the target by hand.
    let placed = s.work.join("placed");
    drama_fixtures::write_preset("tiny", 12, &placed).unwrap();
    let before = leftovers(&placed);
    let (code, _, stderr) = fetch(&s, &hub, &placed);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("not one fetched from")
            && stderr.contains(".drama-fetched.json")
            && stderr.contains(&format!("--checkpoint {}", placed.display())),
        "{stderr}"
    );
    assert_eq!(leftovers(&placed), before, "the directory was modified");
    // A fetched directory whose files were replaced by another checkpoint's, record kept.
    let target = s.work.join("ckpt");
    assert_eq!(fetch(&s, &hub, &target).0, Some(0));
    assert!(target.join(".drama-fetched.json").is_file());
    for name in before {
        std::fs::copy(placed.join(&name), target.join(&name)).unwrap();
    }
    let (code, _, stderr) = fetch(&s, &hub, &target);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("not one fetched from") && stderr.contains("manifest_sha256"),
        "{stderr}"
    );
}
