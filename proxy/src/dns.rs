//! Sandgate's DNS responder for sandboxes: the sidecar's rules redirect every DNS query of a
//! sandbox here, so DNS is a policy layer too. A name the sandbox's profile allows (on any
//! port) gets real answers, resolved by Sandgate; every other name gets NXDOMAIN and a log
//! line. A query for `<secret>.attacker.example` therefore goes nowhere.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_resolver::proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_resolver::proto::rr::{RData, Record, RecordType, rdata};
use sandgate_policy::{Host, HostName, Reason, Verdict};
use tokio::net::UdpSocket;
use tokio::sync::watch;

use crate::log::Listener;
use crate::shared::Shared;

/// TTL of the answers given to sandboxes: short, so a policy change applies quickly; the
/// proxy resolves again (through its own cache) whenever a connection is made anyway.
const ANSWER_TTL: u32 = 30;
/// Largest DNS message read over UDP.
const MAX_UDP: usize = 1500;

/// Answers queries on `socket` until `stop` turns true.
pub(crate) async fn serve(socket: UdpSocket, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; MAX_UDP];
    loop {
        let (n, peer) = tokio::select! {
            r = socket.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("DNS receive failed: {e}");
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let query = buf[..n].to_vec();
        let (socket, shared) = (socket.clone(), shared.clone());
        tokio::spawn(async move {
            if let Some(reply) = answer(&shared, &query, peer).await {
                let _ = socket.send_to(&reply, peer).await;
            }
        });
    }
}

/// The reply to one query, or `None` for bytes that are not a DNS query at all.
pub(crate) async fn answer(shared: &Shared, query: &[u8], peer: SocketAddr) -> Option<Vec<u8>> {
    let msg = Message::from_vec(query).ok()?;
    if msg.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut resp = Message::response(msg.metadata.id, msg.metadata.op_code);
    resp.metadata.recursion_desired = msg.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    let [q] = msg.queries.as_slice() else {
        resp.metadata.response_code = ResponseCode::FormErr;
        return resp.to_vec().ok();
    };
    resp.add_query(q.clone());
    if msg.metadata.op_code != OpCode::Query {
        resp.metadata.response_code = ResponseCode::NotImp;
        return resp.to_vec().ok();
    }
    let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
    let policy = shared.policy();
    let mut rec = shared.record(Listener::Dns, peer);
    rec.port = 53;
    let text = q.name().to_ascii();
    let Ok(name) = HostName::parse(text.trim_end_matches('.')) else {
        resp.metadata.response_code = ResponseCode::NXDomain;
        rec.host = Some(text);
        rec.fail(&crate::ProxyError::MalformedRequest("query for a name that is not a host name"));
        rec.finish(&policy, &shared.metrics);
        return resp.to_vec().ok();
    };
    rec.host = Some(name.to_string());
    let profile = shared.profile_for(&policy, peer.ip(), None);
    let mut d = policy.decide(profile, &Host::Name(name.clone()), 443);
    // DNS carries no port: a name some rule allows on any port is answered.
    if d.reason == Reason::PortNotAllowed {
        d.verdict = Verdict::Allow;
    }
    rec.decision = Some(d);
    if !d.verdict.proceeds() {
        resp.metadata.response_code = ResponseCode::NXDomain;
        rec.finish(&policy, &shared.metrics);
        return resp.to_vec().ok();
    }
    let want = q.query_type();
    if matches!(want, RecordType::A | RecordType::AAAA) {
        match shared.resolver.resolve(&policy, &name, &shared.metrics).await {
            Ok(addrs) => {
                for ip in addrs {
                    let rdata = match (ip, want) {
                        (IpAddr::V4(v4), RecordType::A) => RData::A(rdata::A(v4)),
                        (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(rdata::AAAA(v6)),
                        _ => continue,
                    };
                    resp.add_answer(Record::from_rdata(q.name().clone(), ANSWER_TTL, rdata));
                }
            }
            Err(e) => {
                resp.metadata.response_code = ResponseCode::ServFail;
                rec.fail(&e);
            }
        }
    }
    // Other types (HTTPS, TXT, ...) of an allowed name: an empty answer (NODATA).
    rec.finish(&policy, &shared.metrics);
    resp.to_vec().ok()
}
