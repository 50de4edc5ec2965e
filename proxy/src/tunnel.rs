//! Moving allowed bytes: splice(2) between the two sockets through a kernel pipe, so tunnel
//! payload never enters user space. Pipes come from a shared pool and are held only while a
//! burst is in flight: an idle tunnel holds two sockets and no pipe, which keeps memory and
//! file descriptors per idle tunnel low.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// Bytes asked of one splice call: large enough to move a full socket buffer at once.
const SPLICE_CHUNK: usize = 1 << 20;
/// Pipe capacity asked for; the kernel's default of 64 KiB costs 16x more syscalls per byte.
const PIPE_SIZE: usize = 1 << 20;
/// Idle pipes kept for reuse; more are closed when returned.
const POOL_KEEP: usize = 64;

/// A pool of pipes for splicing, shared by every tunnel.
#[derive(Debug, Default)]
pub struct PipePool {
    idle: Mutex<Vec<Pipe>>,
}

#[derive(Debug)]
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

/// Bytes moved by a finished tunnel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transferred {
    /// Client to upstream.
    pub up: u64,
    /// Upstream to client.
    pub down: u64,
}

/// How a tunnel ended.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// Nothing moved in either direction for the idle timeout.
    #[error("idle for {0:?}")]
    Idle(Duration, Transferred),
    /// A socket or pipe failed.
    #[error("{source}")]
    Io {
        /// The failure.
        #[source]
        source: io::Error,
        /// What moved before it.
        moved: Transferred,
    },
}

// === impl PipePool ===

impl PipePool {
    fn take(&self) -> io::Result<Pipe> {
        if let Some(p) = self.idle.lock().ok().and_then(|mut v| v.pop()) {
            return Ok(p);
        }
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        // Best effort: a smaller pipe still works, only with more syscalls.
        let _ = rustix::pipe::fcntl_setpipe_size(&write, PIPE_SIZE);
        Ok(Pipe { read, write })
    }

    fn give(&self, pipe: Pipe) {
        if let Ok(mut v) = self.idle.lock()
            && v.len() < POOL_KEEP
        {
            v.push(pipe);
        }
    }
}

/// Relays both directions until both have ended, a socket fails, or nothing moves for `idle`.
/// `early_up` holds bytes already read from the client (a ClientHello, a request head) that
/// must reach the upstream first; it is freed once written, so an idle tunnel holds no buffer.
pub async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    early_up: BytesMut,
    idle: Duration,
    pool: &PipePool,
) -> Result<Transferred, TunnelError> {
    let early_len = early_up.len() as u64;
    if !early_up.is_empty() {
        upstream
            .write_all(&early_up)
            .await
            .map_err(|source| TunnelError::Io { source, moved: Transferred::default() })?;
    }
    drop(early_up);
    let started = Instant::now();
    let last = AtomicU64::new(0);
    let up = AtomicU64::new(early_len);
    let down = AtomicU64::new(0);
    let moved = || Transferred { up: up.load(Ordering::Relaxed), down: down.load(Ordering::Relaxed) };
    let both = async {
        let (a, b) = tokio::join!(
            one_way(client, upstream, pool, &up, &last, started),
            one_way(upstream, client, pool, &down, &last, started),
        );
        a.and(b)
    };
    let watchdog = async {
        loop {
            let since = Duration::from_millis(last.load(Ordering::Relaxed));
            let quiet = started.elapsed().saturating_sub(since);
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    };
    tokio::select! {
        r = both => r.map(|()| moved()).map_err(|source| TunnelError::Io { source, moved: moved() }),
        () = watchdog => Err(TunnelError::Idle(idle, moved())),
    }
}

/// Splices `from` into `to` until `from` reaches end of stream, then half-closes `to`.
async fn one_way(
    from: &TcpStream,
    to: &TcpStream,
    pool: &PipePool,
    count: &AtomicU64,
    last: &AtomicU64,
    started: Instant,
) -> io::Result<()> {
    let mut held: Option<Pipe> = None;
    let result = async {
        loop {
            let pipe = match held.as_ref() {
                Some(p) => p,
                None => {
                    from.readable().await?;
                    held.insert(pool.take()?)
                }
            };
            let n = match from.try_io(Interest::READABLE, || {
                rustix::pipe::splice(
                    from,
                    None,
                    &pipe.write,
                    None,
                    SPLICE_CHUNK,
                    SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
                )
                .map_err(io::Error::from)
            }) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Drained: give the pipe back while this direction waits for data.
                    if let Some(p) = held.take() {
                        pool.give(p);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut left = n;
            while left > 0 {
                to.writable().await?;
                match to.try_io(Interest::WRITABLE, || {
                    rustix::pipe::splice(&pipe.read, None, to, None, left, SpliceFlags::NONBLOCK | SpliceFlags::MOVE)
                        .map_err(io::Error::from)
                }) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            count.fetch_add(n as u64, Ordering::Relaxed);
            last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }
    .await;
    match result {
        Ok(()) => {
            // A pipe is returned only when empty; after an error it may hold bytes, so drop it.
            if let Some(p) = held.take() {
                pool.give(p);
            }
            let _ = socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn relays_both_ways_and_counts() {
        let (mut client_outer, mut client) = pair().await;
        let (mut upstream, mut server) = pair().await;
        let pool = PipePool::default();
        let relay = tokio::spawn(async move {
            relay(&mut client, &mut upstream, BytesMut::from(&b"hello "[..]), Duration::from_secs(5), &pool).await.unwrap()
        });
        let payload = vec![0xabu8; 3 << 20];
        let p2 = payload.clone();
        let writer = tokio::spawn(async move {
            client_outer.write_all(&p2).await.unwrap();
            client_outer.shutdown().await.unwrap();
            let mut back = Vec::new();
            client_outer.read_to_end(&mut back).await.unwrap();
            back
        });
        let mut got = Vec::new();
        let mut head = [0u8; 6];
        server.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"hello ");
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), payload.len());
        server.write_all(b"bye").await.unwrap();
        server.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), b"bye");
        let t = relay.await.unwrap();
        assert_eq!(t, Transferred { up: 6 + (3 << 20), down: 3 });
    }

    #[tokio::test]
    async fn idle_tunnels_time_out() {
        let (_c, mut client) = pair().await;
        let (mut upstream, _s) = pair().await;
        let pool = PipePool::default();
        let r = relay(&mut client, &mut upstream, BytesMut::new(), Duration::from_millis(200), &pool).await;
        assert!(matches!(r, Err(TunnelError::Idle(..))), "{r:?}");
    }
}
