//! A minimal Hugging Face hub on 127.0.0.1 for `drama fetch` tests: it serves one checkpoint
//! directory as `plotarmordev/drama-3-NVFP4-Pruned` at one revision, speaking just the
//! requests hf-hub's blocking client makes (the revision listing and ranged `resolve`
//! downloads). It can misbehave on purpose: cut a file off midway, stall in one, or serve
//! altered bytes.
//! Raw HTTP/1.1 over `std::net`, so a test controls every byte that goes out.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// How the hub misbehaves.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Serves every file faithfully.
    None,
    /// Announces the full length of this file, sends half of it, then closes the connection.
    CutOff(String),
    /// Serves this file with its last byte flipped (consistent lengths, wrong content).
    Tampered(String),
    /// The revision listing reports this commit instead of the requested one.
    ServesCommit(String),
    /// Announces the full length of this file, sends half of it, then sends nothing more
    /// until the client goes away.
    Stalls(String),
}

/// A running fake hub; stops when dropped.
pub struct FakeHub {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    stop: Arc<AtomicBool>,
    address: std::net::SocketAddr,
    repo: Arc<Repo>,
}

struct Repo {
    name: String,
    revision: String,
    files: BTreeMap<String, Vec<u8>>,
    fault: Fault,
    /// Set once a `Stalls` file's download has stalled.
    stalled: AtomicBool,
}

impl FakeHub {
    /// Serves the files of `dir` as repository `repo` at `revision`.
    pub fn start(dir: &Path, repo: &str, revision: &str, fault: Fault) -> FakeHub {
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            files.insert(name, std::fs::read(entry.path()).unwrap());
        }
        let repo = Arc::new(Repo {
            name: repo.to_string(),
            revision: revision.to_string(),
            files,
            fault,
            stalled: AtomicBool::new(false),
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let served = repo.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let repo = served.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &repo);
                });
            }
        });
        FakeHub {
            endpoint: format!("http://{address}"),
            stop,
            address,
            repo,
        }
    }

    /// Whether a `Stalls` download has reached its stall.
    pub fn stalled(&self) -> bool {
        self.repo.stalled.load(Ordering::SeqCst)
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.address);
    }
}

fn serve(mut stream: TcpStream, repo: &Repo) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut range_start = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
        let lower = header.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("range: bytes=") {
            range_start = value.trim().split('-').next().unwrap_or("0").parse().unwrap_or(0);
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let info_path = format!("/api/models/{}/revision/", repo.name);
    let resolve_path = format!("/{}/resolve/", repo.name);
    if let Some(revision) = path.strip_prefix(&info_path) {
        if revision != repo.revision {
            return respond(&mut stream, "404 Not Found", &[], b"{\"error\":\"Revision Not Found\"}");
        }
        let sha = match &repo.fault {
            Fault::ServesCommit(other) => other.clone(),
            _ => repo.revision.clone(),
        };
        let siblings: Vec<serde_json::Value> = repo
            .files
            .keys()
            .map(|name| serde_json::json!({ "rfilename": name }))
            .collect();
        let body = serde_json::json!({ "id": repo.name, "sha": sha, "siblings": siblings }).to_string();
        return respond(
            &mut stream,
            "200 OK",
            &[("Content-Type", "application/json".into())],
            body.as_bytes(),
        );
    }
    let Some(rest) = path.strip_prefix(&resolve_path) else {
        return respond(&mut stream, "404 Not Found", &[], b"not found");
    };
    let (revision, file) = rest.split_once('/').unwrap_or((rest, ""));
    let Some(content) = repo.files.get(file).filter(|_| revision == repo.revision) else {
        return respond(&mut stream, "404 Not Found", &[], b"Entry not found");
    };
    let mut content = content.clone();
    if repo.fault == Fault::Tampered(file.to_string()) {
        *content.last_mut().unwrap() ^= 1;
    }
    let total = content.len();
    let start = range_start.min(total);
    let body = &content[start..];
    let end = total.saturating_sub(1).max(start);
    let headers = [
        ("Content-Range", format!("bytes {start}-{end}/{total}")),
        (
            "ETag",
            format!("\"{}\"", drama_checkpoint::manifest::sha256_hex(&content)),
        ),
        ("X-Repo-Commit", repo.revision.clone()),
        ("Content-Length", body.len().to_string()),
    ];
    if repo.fault == Fault::CutOff(file.to_string()) && body.len() > 1 {
        write_head(&mut stream, "206 Partial Content", &headers)?;
        stream.write_all(&body[..body.len() / 2])?;
        stream.flush()?;
        return stream.shutdown(std::net::Shutdown::Both);
    }
    if repo.fault == Fault::Stalls(file.to_string()) && body.len() > 1 {
        write_head(&mut stream, "206 Partial Content", &headers)?;
        stream.write_all(&body[..body.len() / 2])?;
        stream.flush()?;
        repo.stalled.store(true, Ordering::SeqCst);
        // Returns when the client closes the connection.
        return reader.read_line(&mut String::new()).map(drop);
    }
    write_head(&mut stream, "206 Partial Content", &headers)?;
    stream.write_all(body)
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> std::io::Result<()> {
    let mut all: Vec<(&str, String)> = headers.to_vec();
    all.push(("Content-Length", body.len().to_string()));
    write_head(stream, status, &all)?;
    stream.write_all(body)
}

fn write_head(stream: &mut TcpStream, status: &str, headers: &[(&str, String)]) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())
}
