//! Connections whose client stops reading: a write that makes no progress for the client
//! timeout fails, so hyper closes the connection and frees its place. A response nobody
//! reads would otherwise hold one forever once the socket's buffers are full.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A byte stream whose writes fail with [`io::ErrorKind::TimedOut`] once they have made no
/// progress for `limit`; reads pass through.
pub struct WriteStallLimit<T> {
    inner: T,
    limit: Duration,
    /// Runs while writes wait; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteStallLimit<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, limit: Duration) -> WriteStallLimit<T> {
        WriteStallLimit {
            inner,
            limit,
            stalled: None,
        }
    }

    /// Passes on a write's progress, or its wait until the wait has lasted `limit`.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.stalled = None;
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client read nothing for {} s", limit.as_secs_f64()),
        )))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteStallLimit<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteStallLimit<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    /// Fresh bytes for every run (the process's random hasher keys).
    fn random_bytes(n: usize) -> Vec<u8> {
        use std::hash::{BuildHasher, Hasher};
        let state = std::collections::hash_map::RandomState::new();
        (0..n)
            .map(|i| {
                let mut hasher = state.build_hasher();
                hasher.write_usize(i);
                hasher.finish() as u8
            })
            .collect()
    }

    /// A peer that never reads: the write that finds the pipe full fails after the limit,
    /// naming the stall.
    #[test]
    fn a_write_nobody_reads_fails_after_the_limit() {
        runtime().block_on(async {
            let (near, _far) = tokio::io::duplex(64);
            let mut stream = WriteStallLimit::new(near, Duration::from_millis(200));
            let start = Instant::now();
            let error = tokio::time::timeout(Duration::from_secs(10), stream.write_all(&random_bytes(4096)))
                .await
                .expect("the write still waits after 10 s")
                .unwrap_err();
            let waited = start.elapsed();
            assert_eq!(error.kind(), io::ErrorKind::TimedOut);
            assert!(error.to_string().contains("read nothing for 0.2 s"), "{error}");
            assert!(waited >= Duration::from_millis(200), "{waited:?}");
        });
    }

    /// A peer reading slowly, each pause shorter than the limit but all of them much longer,
    /// gets every byte: the limit is on a stall, not on the whole write.
    #[test]
    fn a_slow_but_steady_reader_gets_every_byte() {
        runtime().block_on(async {
            let (near, mut far) = tokio::io::duplex(64);
            let mut stream = WriteStallLimit::new(near, Duration::from_millis(300));
            let sent = random_bytes(1024);
            let reader = async move {
                let mut got = Vec::new();
                let mut chunk = [0u8; 64];
                while got.len() < 1024 {
                    tokio::time::sleep(Duration::from_millis(60)).await;
                    let n = far.read(&mut chunk).await.unwrap();
                    got.extend_from_slice(&chunk[..n]);
                }
                got
            };
            let writer = async {
                stream.write_all(&sent).await.unwrap();
                stream.flush().await.unwrap();
            };
            let start = Instant::now();
            let ((), got) = tokio::join!(writer, reader);
            assert_eq!(got, sent);
            assert!(start.elapsed() > Duration::from_millis(600), "{:?}", start.elapsed());
        });
    }
}
