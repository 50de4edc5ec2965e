//! Cost of reading the server name from a ClientHello: the common single-record case (borrowed,
//! no allocation) and a hello split across records (reassembled).
#![expect(clippy::unwrap_used, reason = "a benchmark of fixed inputs")]

mod timing;

fn hello(name: &str, pad: usize) -> Vec<u8> {
    let mut sni = Vec::new();
    sni.extend_from_slice(&u16::try_from(name.len() + 3).unwrap().to_be_bytes());
    sni.push(0);
    sni.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
    sni.extend_from_slice(name.as_bytes());
    let mut exts = Vec::new();
    // A post-quantum-sized key share first, as browsers send it.
    exts.extend_from_slice(&51u16.to_be_bytes());
    exts.extend_from_slice(&u16::try_from(pad).unwrap().to_be_bytes());
    exts.extend(std::iter::repeat_n(0x42, pad));
    exts.extend_from_slice(&0u16.to_be_bytes());
    exts.extend_from_slice(&u16::try_from(sni.len()).unwrap().to_be_bytes());
    exts.extend_from_slice(&sni);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&u16::try_from(exts.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&exts);
    let n = body.len();
    let mut msg = vec![1, (n >> 16) as u8, (n >> 8) as u8, n as u8];
    msg.extend_from_slice(&body);
    msg
}

fn records(msg: &[u8], max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in msg.chunks(max) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&u16::try_from(c.len()).unwrap().to_be_bytes());
        out.extend_from_slice(c);
    }
    out
}

fn main() {
    let small = records(&hello("github.com", 32), 16384);
    let pq = records(&hello("objects.githubusercontent.com", 1222), 16384);
    let split = records(&hello("objects.githubusercontent.com", 1222), 512);
    timing::bench("sni::parse 1 record, x25519-sized", || sandgate_proxy::sni::parse(&small).is_ok());
    timing::bench("sni::parse 1 record, ML-KEM-sized (1.3 KB)", || sandgate_proxy::sni::parse(&pq).is_ok());
    timing::bench("sni::parse 3 records, reassembled", || sandgate_proxy::sni::parse(&split).is_ok());
}
