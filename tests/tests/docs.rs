//! Every command the README and the pages under `docs/` show is run here, so an example
//! cannot go stale.
//!
//! - A fenced block tagged `sh` runs with bash (`set -euo pipefail`) in a scratch folder of
//!   its page, blocks in page order, so a later block may use what an earlier one made.
//!   `drama` (the binary under test) is first on the PATH; HOME and the cache and data
//!   folders are the scratch's own; `127.0.0.1:8080` becomes a free port.
//! - A block tagged `sh repo` runs the same way in the repository root: it may only read.
//! - The README's first block holds the two setup commands; `.ci/run` runs them, and this
//!   test checks they are the same two.
//! - A block tagged `console` is shown, not run: each must be listed in [`NOT_RUN`] with
//!   the reason, so that no example hides there by accident.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Blocks shown but not run: (page, the block's first line, why).
const NOT_RUN: &[(&str, &str, &str)] = &[
    (
        "README.md",
        "cargo install --path cli --locked",
        "a release build of several minutes; the tests build and run the same code",
    ),
    (
        "docs/cli.md",
        "drama fetch",
        "downloads from the Hugging Face hub; tests/tests/fetch.rs runs it against a local fake hub",
    ),
    (
        "docs/performance.md",
        "drama fixture --preset bench --out /tmp/bench",
        "the GPU machine's recipe: a 9.2 GB checkpoint and a datacenter GPU",
    ),
];

/// Longest a block may run.
const BLOCK_LIMIT: Duration = Duration::from_secs(600);

/// One fenced code block of a page.
struct Block {
    /// Where it opens (1-based line of the fence).
    line: usize,
    /// The info string after the fence (`sh`, `sh repo`, `console`...).
    info: String,
    /// Its text.
    text: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// README.md, CONTRIBUTING.md (where present) and every page under docs/.
fn pages() -> Vec<String> {
    let root = repo_root();
    let mut pages = vec!["README.md".to_string()];
    if root.join("CONTRIBUTING.md").exists() {
        pages.push("CONTRIBUTING.md".to_string());
    }
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (index, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    line: index + 1,
                    info: info.trim().to_string(),
                    text: String::new(),
                })
            }
            (Some(_), Some(_)) => blocks.push(open.take().unwrap()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    blocks
}

/// The commands of a block: its lines without comments and blank lines.
fn commands(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split(" #").next().unwrap().trim().to_string())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `script` with bash in `cwd`; on failure or past [`BLOCK_LIMIT`], the panic shows
/// the script and what it printed. A background job the block leaves running (a server) is
/// ended when the block's shell exits.
fn run_block(page: &str, block: &Block, cwd: &Path, scratch: &Path) {
    let script = block
        .text
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{}", free_port()));
    let guarded = format!("trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}");
    let binary_dir = drama_tests::drama_binary().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", binary_dir.display(), std::env::var("PATH").unwrap_or_default());
    let home = scratch.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let (stdout, stderr) = (scratch.join("stdout"), scratch.join("stderr"));
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &guarded])
        .current_dir(cwd)
        .env("PATH", path)
        .env("HOME", &home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_DATA_HOME", home.join("data"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > BLOCK_LIMIT {
            // The shell (not yet reaped, so its pid is still its own) runs its trap first.
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            std::thread::sleep(Duration::from_secs(2));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let printed = format!(
        "--- stdout\n{}\n--- stderr\n{}",
        std::fs::read_to_string(&stdout).unwrap_or_default(),
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    match status {
        Some(status) if status.success() => {}
        Some(status) => panic!("{page}:{} failed ({status}):\n{script}{printed}", block.line),
        None => panic!("{page}:{} ran past {BLOCK_LIMIT:?}:\n{script}{printed}", block.line),
    }
}

/// The two commands the README puts first are the ones CI runs.
#[test]
fn the_readme_setup_commands_are_what_ci_runs() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let setup = blocks(&readme).into_iter().next().expect("README has a code block");
    assert_eq!(setup.info, "sh");
    let setup = commands(&setup.text);
    assert_eq!(setup.len(), 2, "{setup:?}");
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let ci_commands = commands(&ci);
    let tail = &ci_commands[ci_commands.len() - 2..];
    assert_eq!(
        tail,
        setup.as_slice(),
        ".ci/run must end with the README's two commands"
    );
}

/// Every `sh` block of every page runs and succeeds; every `console` block is listed in
/// [`NOT_RUN`]; no other tag hides commands.
#[test]
fn every_documented_command_runs() {
    let root = repo_root();
    let mut unrun_seen = Vec::new();
    let mut ran = 0;
    for page in pages() {
        let markdown = std::fs::read_to_string(root.join(&page)).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let work = scratch.path().join("work");
        std::fs::create_dir(&work).unwrap();
        for (index, block) in blocks(&markdown).iter().enumerate() {
            if page == "README.md" && index == 0 {
                continue; // The setup commands: see the test above.
            }
            let first = commands(&block.text).into_iter().next().unwrap_or_default();
            match block.info.as_str() {
                "sh" => run_block(&page, block, &work, scratch.path()),
                "sh repo" => run_block(&page, block, &root, scratch.path()),
                "console" => {
                    assert!(
                        NOT_RUN.iter().any(|&(p, f, _)| p == page && f == first),
                        "{page}:{}: a console block (`{first}`) not listed in NOT_RUN",
                        block.line
                    );
                    unrun_seen.push((page.clone(), first));
                    continue;
                }
                "" | "text" | "json" | "wgsl" | "rust" | "python" => {
                    let hidden = commands(&block.text).into_iter().find(|line| {
                        ["drama ", "cargo ", "scripts/", "curl ", ".gpu/drama "]
                            .iter()
                            .any(|command| line.starts_with(command))
                    });
                    assert!(
                        hidden.is_none(),
                        "{page}:{}: a command in a block tagged {:?} (run it as `sh` or list it as `console`): {hidden:?}",
                        block.line,
                        block.info
                    );
                    continue;
                }
                other => panic!("{page}:{}: unknown code block tag {other:?}", block.line),
            }
            eprintln!("ran {page}:{} ({first})", block.line);
            ran += 1;
        }
    }
    for &(page, first, why) in NOT_RUN {
        assert!(
            unrun_seen.iter().any(|(p, f)| p == page && f == first),
            "NOT_RUN lists `{first}` in {page} ({why}), which no longer shows it"
        );
    }
    assert!(ran >= 8, "only {ran} blocks ran");
}
