//! Moving allowed bytes: splice(2) between the two sockets through a kernel pipe, so tunnel
//! payload never enters user space. Pipes come from a shared pool and are held only while a
//! burst is in flight: an idle tunnel holds two sockets and no pipe, which keeps memory and
//! file descriptors per idle tunnel low.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
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
const POOL_KEEP: usize = 256;
/// Bytes a direction copies through user space before it switches to splice: handshakes and
/// short exchanges are cheaper as one read and one write than as two splices through a pipe;
/// bulk transfers are far cheaper spliced.
const SPLICE_AFTER: u64 = 64 * 1024;
/// The transient copy buffer: one TLS record and then some.
const COPY_CHUNK: usize = 16 * 1024 + 512;

/// A pool of pipes for splicing, shared by every tunnel.
#[derive(Debug, Default)]
pub struct PipePool {
    idle: Mutex<Vec<Pipe>>,
}

#[derive(Debug)]
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// The pipe's capacity: a splice into an empty pipe that moves less than this found the
    /// socket drained.
    capacity: usize,
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
        let capacity = rustix::pipe::fcntl_setpipe_size(&write, PIPE_SIZE)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))
            .unwrap_or(4096);
        Ok(Pipe { read, write, capacity })
    }

    fn give(&self, pipe: Pipe) {
        if let Ok(mut v) = self.idle.lock()
            && v.len() < POOL_KEEP
        {
            v.push(pipe);
        }
    }
}

/// What one step of a direction did.
enum Chunk {
    /// The source reached end of stream.
    Eof,
    /// Nothing to read now; readiness is cleared, so the next step waits.
    Drained,
    /// This many bytes reached the destination.
    Moved(usize),
}

/// Reads once into a transient buffer and writes it all. The buffer lives only while bytes
/// are in flight, so an idle tunnel holds none.
async fn copy_chunk(from: &TcpStream, to: &TcpStream) -> io::Result<Chunk> {
    from.readable().await?;
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut moved = 0;
    // As with splice below: a short read drained the socket, so clear readiness now.
    let r = from.try_io(Interest::READABLE, || {
        let n = rustix::io::read(from, &mut buf[..]).map_err(io::Error::from)?;
        moved = n;
        if n > 0 && n < COPY_CHUNK { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
    });
    let n = match r {
        Ok(0) => return Ok(Chunk::Eof),
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && moved > 0 => moved,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Chunk::Drained),
        Err(e) => return Err(e),
    };
    let mut off = 0;
    while off < n {
        to.writable().await?;
        match to.try_write(&buf[off..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(m) => off += m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Chunk::Moved(n))
}

/// Splices what the socket holds (up to the pipe's capacity) into the pipe, then all of it
/// out to the destination. The pipe is empty before and after.
async fn splice_chunk(from: &TcpStream, to: &TcpStream, pipe: &Pipe) -> io::Result<Chunk> {
    // A splice into the empty pipe that moves less than the pipe holds has drained the
    // socket: report it as WouldBlock so tokio clears the readiness now, instead of paying one
    // more splice that fails with EAGAIN. A later arrival is a new edge.
    let mut moved = 0;
    let want = SPLICE_CHUNK.min(pipe.capacity);
    let r = from.try_io(Interest::READABLE, || {
        let n = rustix::pipe::splice(from, None, &pipe.write, None, want, SpliceFlags::NONBLOCK | SpliceFlags::MOVE)
            .map_err(io::Error::from)?;
        moved = n;
        if n > 0 && n < want { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
    });
    let n = match r {
        Ok(0) => return Ok(Chunk::Eof),
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && moved > 0 => moved,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Chunk::Drained),
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
    Ok(Chunk::Moved(n))
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
    let ended = AtomicU8::new(0);
    let moved = || Transferred { up: up.load(Ordering::Relaxed), down: down.load(Ordering::Relaxed) };
    let both = async {
        let (a, b) = tokio::join!(
            one_way(client, upstream, pool, &up, &last, started, &ended),
            one_way(upstream, client, pool, &down, &last, started, &ended),
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
    ended: &AtomicU8,
) -> io::Result<()> {
    let mut held: Option<Pipe> = None;
    let mut total: u64 = 0;
    let result = async {
        loop {
            let n = if total < SPLICE_AFTER {
                match copy_chunk(from, to).await? {
                    Chunk::Eof => return Ok(()),
                    Chunk::Drained => continue,
                    Chunk::Moved(n) => n,
                }
            } else {
                let pipe = match held.as_ref() {
                    Some(p) => p,
                    None => {
                        from.readable().await?;
                        held.insert(pool.take()?)
                    }
                };
                match splice_chunk(from, to, pipe).await? {
                    Chunk::Eof => return Ok(()),
                    Chunk::Drained => {
                        // Give the pipe back while this direction waits for data.
                        if let Some(p) = held.take() {
                            pool.give(p);
                        }
                        continue;
                    }
                    Chunk::Moved(n) => n,
                }
            };
            total += n as u64;
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
            // The first direction to end half-closes its peer; when the second ends both sockets
            // are about to be closed, which sends the FIN anyway.
            if ended.fetch_add(1, Ordering::Relaxed) == 0 {
                let _ = socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
            }
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
            relay(&mut client, &mut upstream, BytesMut::from(&b"hello "[..]), Duration::from_secs(5), &pool)
                .await
                .unwrap()
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
