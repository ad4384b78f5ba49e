//! A real `drama serve` process on 127.0.0.1 for the service tests, and a small client.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::drama_binary;

/// A running server; terminated (SIGTERM) when dropped.
pub struct Server {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// What the server has written to stderr after its listening line.
    stderr: Arc<Mutex<String>>,
}

/// An HTTP answer: status, headers (lowercase names) and body.
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Answer {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

impl Server {
    /// Starts `drama serve` on an ephemeral loopback port with extra arguments.
    pub fn start(checkpoint: &Path, data_dir: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(drama_binary())
            .args([
                "serve",
                "--checkpoint",
                checkpoint.to_str().unwrap(),
                "--addr",
                "127.0.0.1:0",
            ])
            .args(["--data-dir", data_dir.to_str().unwrap()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("drama serve starts");
        let stderr = child.stderr.take().expect("piped");
        let mut lines = BufReader::new(stderr).lines();
        let base = loop {
            let line = lines
                .next()
                .expect("the server exited before listening")
                .expect("stderr readable");
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.trim().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on it.
        let stderr = Arc::new(Mutex::new(String::new()));
        let drained = stderr.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut text = drained.lock().expect("stderr lock");
                text.push_str(&line);
                text.push('\n');
            }
        });
        let server = Server {
            child: Some(child),
            base,
            stderr,
        };
        for _ in 0..200 {
            if server.get("/ready").status == 200 {
                return server;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server never became ready");
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder().http_status_as_error(false).build().into()
    }

    fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
        let mut response = response.expect("the request completes");
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_ascii_lowercase(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let mut body = Vec::new();
        response
            .body_mut()
            .as_reader()
            .read_to_end(&mut body)
            .expect("the body reads");
        Answer { status, headers, body }
    }

    /// GET `path`.
    pub fn get(&self, path: &str) -> Answer {
        Self::answer(Self::agent().get(format!("{}{path}", self.base)).call())
    }

    /// HEAD `path`.
    pub fn head(&self, path: &str) -> Answer {
        Self::answer(Self::agent().head(format!("{}{path}", self.base)).call())
    }

    /// DELETE `path`.
    pub fn delete(&self, path: &str) -> Answer {
        Self::answer(Self::agent().delete(format!("{}{path}", self.base)).call())
    }

    /// POST `body` with a content type.
    pub fn post(&self, path: &str, content_type: &str, body: &[u8]) -> Answer {
        Self::answer(
            Self::agent()
                .post(format!("{}{path}", self.base))
                .header("content-type", content_type)
                .send(body),
        )
    }

    /// POST a JSON speech request.
    pub fn speech(&self, request: &serde_json::Value) -> Answer {
        self.post("/v1/audio/speech", "application/json", request.to_string().as_bytes())
    }

    /// Opens a streaming speech request and returns its reader after the headers.
    pub fn open_stream(&self, request: &serde_json::Value) -> impl Read {
        let response = Self::agent()
            .post(format!("{}/v1/audio/speech", self.base))
            .header("content-type", "application/json")
            .send(request.to_string().as_bytes())
            .expect("the stream opens");
        assert_eq!(response.status().as_u16(), 200);
        response.into_body().into_reader()
    }

    /// The address to open raw TCP connections to (`127.0.0.1:PORT`).
    pub fn address(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// Sends a signal (`INT`, `TERM`...) to the server.
    pub fn signal(&self, name: &str) {
        let child = self.child.as_ref().expect("running");
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{name} failed");
    }

    /// Waits until the server's stderr (after its listening line) contains `text`; false
    /// if it does not within `limit`.
    pub fn wait_for_stderr(&self, text: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.stderr().contains(text) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// What the server has written to stderr after its listening line.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }

    /// The server's exit code if it exits within `limit` (`Some(None)`: killed by a
    /// signal); `None` if it still runs.
    pub fn exit_within(&mut self, limit: Duration) -> Option<Option<i32>> {
        let child = self.child.as_mut().expect("running");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("the server can be waited for") {
                self.child = None;
                return Some(status.code());
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and returns the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        self.signal("TERM");
        let mut child = self.child.take().expect("running");
        child.wait().expect("the server exits").code()
    }

    /// A metric's value from `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let text = String::from_utf8(self.get("/metrics").body).expect("metrics are text");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no metric {name} in {text}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
