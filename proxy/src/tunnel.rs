//! Moving allowed bytes between a client and its upstream. The first 64 KiB of each
//! direction (handshakes, short exchanges) are copied through a transient buffer; after that
//! bytes are spliced (splice(2)) through a kernel pipe and never enter user space. Buffers and
//! pipes are held only while bytes are in flight, and the relay is a hand-written future that
//! stores no readiness futures: an idle tunnel costs two sockets and a few hundred bytes.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::time::Sleep;

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
    let mut relay = Relay {
        ends: [&*client, &*upstream],
        pool,
        dirs: [Dir::default(), Dir::default()],
        idle,
        last: Instant::now(),
        watchdog: Box::pin(tokio::time::sleep(idle)),
        half_closed: false,
    };
    relay.dirs[0].total = early_len;
    relay.await
}

/// Both directions of a tunnel, polled by hand.
struct Relay<'a> {
    /// `[client, upstream]`; direction 0 is client to upstream, direction 1 the reverse.
    ends: [&'a TcpStream; 2],
    pool: &'a PipePool,
    dirs: [Dir; 2],
    idle: Duration,
    last: Instant,
    watchdog: Pin<Box<Sleep>>,
    half_closed: bool,
}

/// One direction's state.
#[derive(Default)]
struct Dir {
    /// Bytes moved so far.
    total: u64,
    /// Bytes read but not yet written: in the pipe, or in `buf[off..len]`.
    pending: usize,
    pipe: Option<Pipe>,
    buf: Option<Vec<u8>>,
    off: usize,
    done: bool,
}

impl Future for Relay<'_> {
    type Output = Result<Transferred, TunnelError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let before = this.moved();
        for d in 0..2 {
            let (from, to) = (this.ends[d], this.ends[1 - d]);
            match poll_dir(&mut this.dirs[d], from, to, this.pool, cx) {
                Poll::Ready(Ok(())) => {
                    // End of stream: the first direction to end half-closes its peer; when the
                    // second ends both sockets are about to be closed, which sends the FIN.
                    if !this.half_closed {
                        this.half_closed = true;
                        let _ = socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
                    }
                }
                Poll::Pending => {}
                Poll::Ready(Err(source)) => {
                    return Poll::Ready(Err(TunnelError::Io { source, moved: this.moved() }));
                }
            }
        }
        if this.dirs.iter().all(|d| d.done) {
            return Poll::Ready(Ok(this.moved()));
        }
        if this.moved() != before {
            this.last = Instant::now();
        }
        // The watchdog fires at `last + idle`; activity only moves `last`, so the timer is
        // re-armed when it fires rather than on every chunk.
        while this.watchdog.as_mut().poll(cx).is_ready() {
            let deadline = this.last + this.idle;
            if Instant::now() >= deadline {
                return Poll::Ready(Err(TunnelError::Idle(this.idle, this.moved())));
            }
            this.watchdog.as_mut().reset(tokio::time::Instant::from_std(deadline));
        }
        Poll::Pending
    }
}

impl Relay<'_> {
    fn moved(&self) -> Transferred {
        Transferred { up: self.dirs[0].total, down: self.dirs[1].total }
    }
}

/// Moves what it can in one direction. `Ready(Ok(()))` only at end of stream (once); while the
/// direction lives it returns `Pending` with wake-ups registered, counting bytes in `dir.total`.
fn poll_dir(
    dir: &mut Dir,
    from: &TcpStream,
    to: &TcpStream,
    pool: &PipePool,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    if dir.done {
        return Poll::Pending;
    }
    loop {
        if dir.pending > 0 {
            ready!(to.poll_write_ready(cx))?;
            let written = match (&dir.pipe, &dir.buf) {
                (Some(pipe), _) => to.try_io(Interest::WRITABLE, || {
                    rustix::pipe::splice(
                        &pipe.read,
                        None,
                        to,
                        None,
                        dir.pending,
                        SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
                    )
                    .map_err(io::Error::from)
                }),
                (None, Some(buf)) => to.try_write(&buf[dir.off..dir.off + dir.pending]),
                (None, None) => Err(io::ErrorKind::InvalidData.into()),
            };
            match written {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(m) => {
                    dir.pending -= m;
                    dir.off += m;
                    dir.total += m as u64;
                    if dir.pending == 0 {
                        // Nothing in flight: the buffer goes back to the allocator.
                        dir.buf = None;
                        dir.off = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            continue;
        }
        if from.poll_read_ready(cx)?.is_pending() {
            // Drained: give the pipe back while this direction waits for data.
            if let Some(p) = dir.pipe.take() {
                pool.give(p);
            }
            return Poll::Pending;
        }
        // A read (or splice into the empty pipe) that returns less than it asked for has
        // drained the socket: report WouldBlock so tokio clears the readiness now instead of
        // paying one more call that fails with EAGAIN. A later arrival is a new edge.
        let mut got = 0;
        let r = if dir.total < SPLICE_AFTER {
            let buf = dir.buf.get_or_insert_with(|| vec![0u8; COPY_CHUNK]);
            from.try_io(Interest::READABLE, || {
                let n = rustix::io::read(from, &mut buf[..]).map_err(io::Error::from)?;
                got = n;
                if n > 0 && n < COPY_CHUNK { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
            })
        } else {
            let pipe = match dir.pipe.take() {
                Some(p) => p,
                None => pool.take()?,
            };
            let want = SPLICE_CHUNK.min(pipe.capacity);
            let r = from.try_io(Interest::READABLE, || {
                let n = rustix::pipe::splice(
                    from,
                    None,
                    &pipe.write,
                    None,
                    want,
                    SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
                )
                .map_err(io::Error::from)?;
                got = n;
                if n > 0 && n < want { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
            });
            dir.pipe = Some(pipe);
            r
        };
        match r {
            Ok(0) => {
                dir.done = true;
                dir.buf = None;
                // The pipe is empty here (pending is 0), so it can be reused.
                if let Some(p) = dir.pipe.take() {
                    pool.give(p);
                }
                return Poll::Ready(Ok(()));
            }
            Ok(n) => dir.pending = n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => dir.pending = got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                dir.buf = None;
            }
            Err(e) => return Poll::Ready(Err(e)),
        }
        dir.off = 0;
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
