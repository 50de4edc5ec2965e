//! TLS ClientHello parsing over bytes read from the client: the server name (SNI) and whether
//! Encrypted Client Hello is offered. Handles a ClientHello split across TCP segments (the
//! caller reads more on `Incomplete`) and across TLS records (fragments are reassembled).
//! Borrows from the input when the ClientHello fits in one record, which is nearly always.

use std::borrow::Cow;

/// TLS record content type for handshake messages.
const CONTENT_HANDSHAKE: u8 = 22;
/// Handshake message type of a ClientHello.
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Extension number of server_name (RFC 6066).
const EXT_SERVER_NAME: u16 = 0;
/// Extension number of encrypted_client_hello (RFC 9460 draft codepoint used by browsers).
const EXT_ECH: u16 = 0xfe0d;
/// Largest ClientHello message believed: real ones are a few KiB even with post-quantum
/// key shares; anything claiming more is refused before buffering it.
const MAX_HELLO_LEN: usize = 1 << 16;
/// A TLS record carries at most 2^14 bytes of plaintext (RFC 8446 §5.1), plus slack for padding.
const MAX_RECORD_LEN: usize = 16384 + 256;

/// What Sandgate needs from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello<'a> {
    /// The host_name entry of the server_name extension, if any (for ECH, the outer name).
    pub server_name: Option<Cow<'a, str>>,
    /// Whether the encrypted_client_hello extension is present.
    pub ech: bool,
}

/// Why bytes are not (yet) a ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// More bytes are needed; read more and parse again.
    #[error("incomplete ClientHello")]
    Incomplete,
    /// The bytes are not a well-formed TLS ClientHello.
    #[error("malformed ClientHello")]
    Malformed,
}

/// Whether the first byte read from a client starts a TLS handshake record.
pub fn looks_like_tls(first: u8) -> bool {
    first == CONTENT_HANDSHAKE
}

/// Parses the ClientHello at the start of `buf` (one or more TLS records).
pub fn parse(buf: &[u8]) -> Result<ClientHello<'_>, HelloError> {
    // Fast path: the whole handshake message inside the first record.
    let (first, _) = record(buf)?;
    if first[0] != HANDSHAKE_CLIENT_HELLO {
        return Err(HelloError::Malformed);
    }
    if first.len() >= 4 && u24(&first[1..4]) > MAX_HELLO_LEN {
        return Err(HelloError::Malformed);
    }
    if first.len() >= 4 {
        let need = 4 + u24(&first[1..4]);
        if first.len() >= need {
            return hello(&first[..need]);
        }
    }
    // Slow path: reassemble the handshake message from consecutive records.
    let mut msg = Vec::with_capacity(MAX_RECORD_LEN);
    let mut rest = buf;
    loop {
        let (fragment, tail) = record(rest)?;
        msg.extend_from_slice(fragment);
        rest = tail;
        if msg.len() >= 4 {
            let need = 4 + u24(&msg[1..4]);
            if msg.len() >= need {
                msg.truncate(need);
                return hello(&msg).map(ClientHello::into_owned);
            }
        }
    }
}

/// Splits one handshake record off the front of `buf`: (its fragment, the rest).
fn record(buf: &[u8]) -> Result<(&[u8], &[u8]), HelloError> {
    if buf.len() < 5 {
        return Err(HelloError::Incomplete);
    }
    if buf[0] != CONTENT_HANDSHAKE || buf[1] != 3 {
        return Err(HelloError::Malformed);
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len == 0 || len > MAX_RECORD_LEN {
        return Err(HelloError::Malformed);
    }
    let body = buf.get(5..5 + len).ok_or(HelloError::Incomplete)?;
    Ok((body, &buf[5 + len..]))
}

fn u24(b: &[u8]) -> usize {
    (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2])
}

/// A bounds-checked reader; every short read is `Malformed`, since the message is complete.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed);
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, HelloError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, HelloError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Result<&'a [u8], HelloError> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }
    fn vec16(&mut self) -> Result<&'a [u8], HelloError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// Parses a complete handshake message that should be a ClientHello.
fn hello(msg: &[u8]) -> Result<ClientHello<'_>, HelloError> {
    let mut r = Reader(msg);
    if r.u8()? != HANDSHAKE_CLIENT_HELLO {
        return Err(HelloError::Malformed);
    }
    r.take(3)?; // length, already checked by the caller
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    let mut out = ClientHello { server_name: None, ech: false };
    if r.0.is_empty() {
        return Ok(out); // no extensions at all (very old clients)
    }
    let mut exts = Reader(r.vec16()?);
    while !exts.0.is_empty() {
        let ty = exts.u16()?;
        let data = exts.vec16()?;
        match ty {
            EXT_SERVER_NAME => out.server_name = server_name(data)?,
            EXT_ECH => out.ech = true,
            _ => {}
        }
    }
    Ok(out)
}

fn server_name(data: &[u8]) -> Result<Option<Cow<'_, str>>, HelloError> {
    let mut list = Reader(Reader(data).vec16()?);
    while !list.0.is_empty() {
        let kind = list.u8()?;
        let name = list.vec16()?;
        if kind == 0 {
            let name = std::str::from_utf8(name).map_err(|_| HelloError::Malformed)?;
            if name.is_empty() {
                return Err(HelloError::Malformed);
            }
            return Ok(Some(Cow::Borrowed(name)));
        }
    }
    Ok(None)
}

impl ClientHello<'_> {
    fn into_owned(self) -> ClientHello<'static> {
        ClientHello { server_name: self.server_name.map(|n| Cow::Owned(n.into_owned())), ech: self.ech }
    }
}

#[cfg(test)]
mod tests;
