//! The transparent listener (connections redirected by nftables) and SNI relays. The original
//! destination comes from `SO_ORIGINAL_DST`; the host from the ClientHello's SNI or the HTTP
//! Host header, read from the first bytes; neither: the original address alone is judged
//! against CIDR rules. The name is resolved and dialled as Sandgate resolved it, never the
//! address the client chose.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use sandgate_policy::{CompiledPolicy, Decision, Host};
use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::ProxyError;
use crate::explicit::{TLS_ALERT_ACCESS_DENIED, finish_tunnel, read_hello};
use crate::log::{ConnRecord, Listener};
use crate::shared::{ConnGuard, Refusal, Shared, denial_message, raw_response};
use crate::sni;

/// Headers parsed from a plain-HTTP request head to find its Host.
const MAX_HEADERS: usize = 100;

/// What the first bytes said about the protocol.
enum Peeked {
    Tls,
    Http,
    Silent,
    Other,
}

/// Serves one transparent (or SNI-relay) connection. `relay_port` is the port to dial for an
/// SNI relay, which has no original destination.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    mut client: TcpStream,
    peer: SocketAddr,
    listener: Listener,
    relay_port: Option<u16>,
    _guard: ConnGuard,
) {
    let policy = shared.policy();
    let mut rec = shared.record(listener, peer);
    let orig = match relay_port {
        Some(_) => None,
        None => match original_dst(&client) {
            Some(o) => Some(o),
            None => return fail(&shared, &policy, rec, ProxyError::NoOriginalDestination),
        },
    };
    let Some(port) = orig.map(|o| o.port()).or(relay_port) else { return };
    rec.port = port;

    let mut buf = BytesMut::with_capacity(2048);
    let peeked = match tokio::time::timeout(shared.limits.first_byte_timeout, client.read_buf(&mut buf)).await {
        Err(_) => Peeked::Silent,
        Ok(Ok(0)) => {
            return fail(&shared, &policy, rec, ProxyError::MalformedRequest("closed before sending anything"));
        }
        Ok(Ok(_)) if sni::looks_like_tls(buf[0]) => Peeked::Tls,
        Ok(Ok(_)) if looks_like_http(&buf) => Peeked::Http,
        Ok(Ok(_)) => Peeked::Other,
        Ok(Err(e)) => return fail(&shared, &policy, rec, ProxyError::Io(e)),
    };

    let mut ech = false;
    let named = match peeked {
        Peeked::Tls => {
            if let Err(e) = Box::pin(read_hello(&mut client, &mut buf, &shared.limits)).await {
                return fail(&shared, &policy, rec, e);
            }
            match sni::parse(&buf) {
                Ok(hello) => {
                    ech = hello.ech;
                    rec.sni = hello.server_name.as_deref().map(str::to_owned);
                    hello.server_name.map(|n| n.into_owned())
                }
                Err(_) => return fail(&shared, &policy, rec, ProxyError::MalformedHello),
            }
        }
        Peeked::Http => match Box::pin(read_http_host(&mut client, &mut buf, &shared.limits)).await {
            Ok(host) => host,
            Err(e) => return fail(&shared, &policy, rec, e),
        },
        Peeked::Silent | Peeked::Other => None,
    };
    let host = match (named, orig) {
        (Some(name), _) => match Host::parse(&name) {
            Ok(h) => h,
            Err(_) => {
                return fail(&shared, &policy, rec, ProxyError::MalformedRequest("server name is not a host name"));
            }
        },
        (None, Some(o)) => Host::Ip(o.ip()),
        (None, None) => return fail(&shared, &policy, rec, ProxyError::MalformedRequest("no SNI or Host to relay by")),
    };
    rec.host = Some(host.to_string());
    let profile = shared.profile_for(&policy, peer.ip(), None);

    if ech && policy.refuses_ech() {
        let d = policy.refuse(profile, sandgate_policy::Reason::EchRefused);
        rec.decision = Some(d);
        if !d.verdict.proceeds() {
            return refuse(&shared, &policy, client, rec, &d, &peeked).await;
        }
    }
    // Boxed: the resolver's future is large and lives only while the tunnel is set up.
    let mut upstream = match Box::pin(shared.open_upstream(&policy, &mut rec, profile, &host, port)).await {
        Ok(s) => s,
        Err(Refusal::Denied(d)) => return refuse(&shared, &policy, client, rec, &d, &peeked).await,
        Err(Refusal::Failed(e)) => return fail(&shared, &policy, rec, e),
    };
    if let (Peeked::Tls, Host::Name(name)) = (&peeked, &host)
        && policy.intercepts(name)
    {
        let Some(icpt) = shared.interceptor.clone() else {
            return fail(
                &shared,
                &policy,
                rec,
                ProxyError::Credential("the policy intercepts this host but no CA is loaded".into()),
            );
        };
        let name = name.clone();
        Box::pin(crate::intercept::serve(
            shared.clone(),
            icpt,
            policy.clone(),
            client,
            buf,
            upstream,
            rec,
            profile,
            name,
            port,
        ))
        .await;
        return;
    }
    finish_tunnel(&shared, &policy, &mut client, &mut upstream, buf, rec).await;
}

/// Answers a denial in the client's own protocol: a TLS alert, an HTTP 403, or a close.
async fn refuse(
    shared: &Shared,
    policy: &CompiledPolicy,
    mut client: TcpStream,
    rec: Box<ConnRecord>,
    d: &Decision,
    peeked: &Peeked,
) {
    match peeked {
        Peeked::Tls => {
            let _ = client.write_all(&TLS_ALERT_ACCESS_DENIED).await;
        }
        Peeked::Http => {
            let body = denial_message(policy, rec.host.as_deref().unwrap_or(""), rec.port, d);
            let _ = client.write_all(raw_response("403 Forbidden", d.reason.as_str(), &body).as_bytes()).await;
        }
        Peeked::Silent | Peeked::Other => {}
    }
    let _ = client.shutdown().await;
    rec.finish(policy, &shared.metrics);
}

fn fail(shared: &Shared, policy: &CompiledPolicy, mut rec: Box<ConnRecord>, e: ProxyError) {
    rec.fail(&e);
    rec.finish(policy, &shared.metrics);
}

/// The destination a connection had before nftables redirected it; `None` if it was not
/// redirected.
fn original_dst(stream: &TcpStream) -> Option<SocketAddr> {
    let sock = SockRef::from(stream);
    let local = stream.local_addr().ok()?;
    // An IPv4 connection on a dual-stack `[::]` listener has a v4-mapped local address, and
    // its NAT record is IPv4's.
    let v4 = match local {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    let orig = if v4 { sock.original_dst_v4() } else { sock.original_dst_v6() };
    let orig = orig.ok()?.as_socket()?;
    // Without NAT some kernels report the local address itself: that is no redirect.
    (orig != local).then_some(orig)
}

/// Whether the first bytes start an HTTP/1 request line (an upper-case method and a space).
fn looks_like_http(buf: &[u8]) -> bool {
    let method_len = buf.iter().take(12).take_while(|b| b.is_ascii_uppercase()).count();
    method_len >= 3 && buf.get(method_len).is_none_or(|b| *b == b' ')
}

/// Reads a request head into `buf` and returns its Host (without port), if any.
async fn read_http_host(
    client: &mut TcpStream,
    buf: &mut BytesMut,
    limits: &crate::Limits,
) -> Result<Option<String>, ProxyError> {
    let deadline = tokio::time::Instant::now() + limits.header_timeout;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(buf) {
            Ok(httparse::Status::Complete(_)) => {
                let host = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("host"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .map(|v| strip_port(v.trim()).to_owned());
                return Ok(host);
            }
            Ok(httparse::Status::Partial) => {}
            Err(_) => return Err(ProxyError::MalformedRequest("unparsable HTTP request head")),
        }
        if buf.len() >= limits.max_header_bytes {
            return Err(ProxyError::HeaderTooLarge(limits.max_header_bytes));
        }
        buf.reserve(4096);
        match tokio::time::timeout_at(deadline, client.read_buf(buf)).await {
            Err(_) => return Err(ProxyError::HeaderTimeout),
            Ok(Ok(0)) => return Err(ProxyError::MalformedRequest("closed inside the request head")),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(ProxyError::Io(e)),
        }
    }
}

/// `host:port` → `host`, `[::1]:80` → `[::1]`.
fn strip_port(v: &str) -> &str {
    if v.starts_with('[') {
        return v.find(']').map_or(v, |i| &v[..=i]);
    }
    match v.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_detection() {
        for (case, buf, want) in [
            ("get", &b"GET / HTTP/1.1\r\n"[..], true),
            ("partial method", b"POS", true),
            ("tls", &[22, 3, 1, 0, 5], false),
            ("lower case", b"get / HTTP/1.1", false),
            ("ssh banner", b"SSH-2.0-OpenSSH", false),
        ] {
            assert_eq!(looks_like_http(buf), want, "{case}");
        }
    }

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("example.com"), "example.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
    }
}
