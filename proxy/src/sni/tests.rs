use super::*;

/// Builds a ClientHello handshake message with the given extensions.
fn hello_msg(exts: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(32);
    body.extend_from_slice(&[9; 32]);
    body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
    body.extend_from_slice(&[1, 0]);
    let mut e = Vec::new();
    for (ty, data) in exts {
        e.extend_from_slice(&ty.to_be_bytes());
        e.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        e.extend_from_slice(data);
    }
    body.extend_from_slice(&u16::try_from(e.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&e);
    let mut msg = vec![1];
    let n = body.len();
    msg.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
    msg.extend_from_slice(&body);
    msg
}

fn sni_ext(name: &str) -> (u16, Vec<u8>) {
    let mut d = Vec::new();
    let entry_len = 3 + name.len();
    d.extend_from_slice(&u16::try_from(entry_len).unwrap().to_be_bytes());
    d.push(0);
    d.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    (0, d)
}

/// Wraps a handshake message in records of at most `max` bytes each.
fn records(msg: &[u8], max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in msg.chunks(max) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&u16::try_from(chunk.len()).unwrap().to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// A large post-quantum-sized key share (ML-KEM-768 + X25519 is 1216 bytes).
fn pq_key_share() -> (u16, Vec<u8>) {
    (51, vec![0x42; 1216 + 6])
}

#[test]
fn sni_from_a_single_record() {
    let buf = records(&hello_msg(&[sni_ext("GitHub.com"), pq_key_share()]), 16384);
    let h = parse(&buf).unwrap();
    assert_eq!(h.server_name.as_deref(), Some("GitHub.com"));
    assert!(!h.ech);
    assert!(matches!(h.server_name, Some(Cow::Borrowed(_))), "single record borrows");
}

#[test]
fn every_prefix_is_incomplete_never_malformed() {
    let buf = records(&hello_msg(&[sni_ext("example.com"), pq_key_share()]), 16384);
    for n in 0..buf.len() {
        assert_eq!(parse(&buf[..n]), Err(HelloError::Incomplete), "prefix {n}");
    }
    assert!(parse(&buf).is_ok());
}

#[test]
fn hello_split_across_records_is_reassembled() {
    let msg = hello_msg(&[pq_key_share(), sni_ext("split.example")]);
    for max in [1, 7, 100, 512] {
        let buf = records(&msg, max);
        assert_eq!(parse(&buf).unwrap().server_name.as_deref(), Some("split.example"), "records of {max}");
        for n in 0..buf.len() {
            assert_eq!(parse(&buf[..n]), Err(HelloError::Incomplete), "records of {max}, prefix {n}");
        }
    }
}

#[test]
fn no_sni_and_ech_are_reported() {
    let buf = records(&hello_msg(&[(EXT_ECH, vec![0; 40])]), 16384);
    let h = parse(&buf).unwrap();
    assert_eq!(h.server_name, None);
    assert!(h.ech);
}

#[test]
fn garbage_is_malformed() {
    let cases: &[(&str, &[u8])] = &[
        ("http request", b"GET / HTTP/1.1\r\n\r\n"),
        ("alert record", &[21, 3, 3, 0, 2, 2, 40]),
        ("zero length record", &[22, 3, 1, 0, 0]),
        ("server hello", &[22, 3, 3, 0, 4, 2, 0, 0, 0]),
        ("overlong record", &[22, 3, 1, 0xff, 0xff]),
        ("not a client hello inside", &[22, 3, 1, 0, 5, 0xde, 0xad, 0xbe, 0xef, 0]),
        ("client hello claiming 11 MiB", &[22, 3, 1, 0, 5, 1, 0xad, 0xbe, 0xef, 0]),
    ];
    for (case, buf) in cases {
        assert_eq!(parse(buf), Err(HelloError::Malformed), "{case}");
    }
    // A truncated extension inside a complete message.
    let mut msg = hello_msg(&[sni_ext("a.example")]);
    let n = msg.len();
    msg[n - 3] = 0xff; // name length now points past the end
    assert_eq!(parse(&records(&msg, 16384)), Err(HelloError::Malformed), "bad inner length");
}

#[test]
fn random_bytes_never_panic() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in 0..2000 {
        let mut buf = vec![22, 3, 1];
        for _ in 0..len % 300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.push(x as u8);
        }
        let _ = parse(&buf);
    }
}
