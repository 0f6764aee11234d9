//! Bad input on real sockets: each case gets a typed ERROR frame (and a log
//! line), the server keeps serving, and the store stays intact.

mod net;

use memfs_store::net::protocol::{self as p, ErrorCode, Frame, Limits, Role};
use memfs_store::net::server::ServerConfig;
use net::{TestServer, create_store, key, poll_until};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

fn raw(srv: &TestServer) -> TcpStream {
    let s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Reads one frame; `None` at EOF.
fn read_frame(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    if s.read_exact(&mut len).is_err() {
        return None;
    }
    let mut rest = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut rest).ok()?;
    Some((rest[0], rest[1..].to_vec()))
}

fn expect_error(s: &mut TcpStream, want: ErrorCode) -> String {
    let (ty, body) = read_frame(s).expect("an ERROR frame");
    match p::parse(ty, &body, 8, &Limits::default()) {
        Ok(Frame::Error { code, message }) => {
            assert_eq!(
                ErrorCode::from_u16(code),
                want,
                "{}",
                String::from_utf8_lossy(message)
            );
            String::from_utf8_lossy(message).into_owned()
        }
        other => panic!("expected ERROR {want}, got {other:?}"),
    }
}

fn expect_closed(s: &mut TcpStream) {
    assert!(
        read_frame(s).is_none(),
        "the server should have closed the connection"
    );
}

fn hello(s: &mut TcpStream, kw: u16) {
    let mut out = Vec::new();
    p::put_hello(&mut out, kw, Role::Write, b"", b"");
    s.write_all(&out).unwrap();
    let (ty, _) = read_frame(s).expect("WELCOME");
    assert_eq!(ty, p::op::WELCOME);
}

fn setup(cfg: ServerConfig) -> (tempfile::TempDir, TestServer) {
    let tmp = tempfile::tempdir().unwrap();
    create_store(tmp.path(), 8);
    let srv = TestServer::start(tmp.path(), cfg, None);
    let mut w = srv.client("", "", Role::Write).unwrap();
    w.set(1, &[(key(1), b"one"), (key(2), b"two")]).unwrap();
    (tmp, srv)
}

/// The store still holds exactly what `setup` wrote, and serves.
fn intact(srv: &TestServer) {
    let mut c = srv.client("", "", Role::Read).unwrap();
    assert_eq!(c.get(&key(1)).unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(c.get(&key(2)).unwrap().as_deref(), Some(&b"two"[..]));
    assert_eq!(c.status().unwrap().current, 1);
}

#[test]
fn malformed_truncated_oversized_frames() {
    let cfg = ServerConfig {
        limits: Limits {
            max_frame: 1 << 16,
            max_batch: 10,
        },
        frame_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let (_tmp, srv) = setup(cfg);

    // Bad magic, unknown version, wrong key width, no handshake.
    let mut s = raw(&srv);
    let mut h = Vec::new();
    p::put_hello(&mut h, 8, Role::Read, b"", b"");
    let mut bad = h.clone();
    bad[5] = b'X';
    s.write_all(&bad).unwrap();
    expect_error(&mut s, ErrorCode::BadMagic);
    expect_closed(&mut s);
    let mut s = raw(&srv);
    let mut bad = h.clone();
    bad[9] = 99;
    s.write_all(&bad).unwrap();
    assert!(expect_error(&mut s, ErrorCode::BadVersion).contains("99"));
    expect_closed(&mut s);
    let mut s = raw(&srv);
    let mut h16 = Vec::new();
    p::put_hello(&mut h16, 16, Role::Read, b"", b"");
    s.write_all(&h16).unwrap();
    assert!(expect_error(&mut s, ErrorCode::KeyWidth).contains("16"));
    expect_closed(&mut s);
    let mut s = raw(&srv);
    let mut g = Vec::new();
    p::put_get(&mut g, &key(1));
    s.write_all(&g).unwrap();
    expect_error(&mut s, ErrorCode::HandshakeRequired);
    expect_closed(&mut s);

    // Oversized and empty frames close the connection.
    let mut s = raw(&srv);
    hello(&mut s, 8);
    s.write_all(&(1u32 << 20).to_le_bytes()).unwrap();
    expect_error(&mut s, ErrorCode::FrameTooLarge);
    expect_closed(&mut s);
    let mut s = raw(&srv);
    hello(&mut s, 8);
    s.write_all(&[0, 0, 0, 0]).unwrap();
    expect_error(&mut s, ErrorCode::Malformed);
    expect_closed(&mut s);

    // Body errors are answered and the connection goes on.
    let mut s = raw(&srv);
    hello(&mut s, 8);
    let mut out = Vec::new();
    p::put_get(&mut out, &[1u8; 5]); // wrong key width
    let at = p::begin(&mut out, p::op::SET); // entry cut short
    out.extend_from_slice(&9u64.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&key(3));
    out.extend_from_slice(&10u16.to_le_bytes());
    out.extend_from_slice(b"short");
    p::end(&mut out, at);
    p::put_empty(&mut out, 0x7f); // unknown type
    p::put_multi_get(&mut out, &[key(1); 11]); // over the batch limit
    p::put_set(&mut out, 1, &[(key(1), b"again")]); // block not increasing
    p::put_set(&mut out, 0, &[(key(1), b"older")]);
    p::put_u64s(&mut out, p::op::ROLLBACK, &[7]); // outside the window
    p::put_get(&mut out, &key(1));
    s.write_all(&out).unwrap();
    assert!(expect_error(&mut s, ErrorCode::KeyWidth).contains("5"));
    expect_error(&mut s, ErrorCode::Malformed);
    expect_error(&mut s, ErrorCode::UnknownType);
    expect_error(&mut s, ErrorCode::BatchTooLarge);
    expect_error(&mut s, ErrorCode::BlockNotIncreasing);
    expect_error(&mut s, ErrorCode::BlockNotIncreasing);
    expect_error(&mut s, ErrorCode::RollbackOutsideWindow);
    let (ty, body) = read_frame(&mut s).unwrap();
    assert_eq!((ty, body.as_slice()), (p::op::VALUE, &b"one"[..]));

    // A frame cut short: the half-sent-frame timeout answers and closes.
    let mut s = raw(&srv);
    hello(&mut s, 8);
    s.write_all(&g[..7]).unwrap();
    assert!(expect_error(&mut s, ErrorCode::Timeout).contains("half-sent"));
    expect_closed(&mut s);
    // A handshake that never completes.
    let mut s = raw(&srv);
    s.write_all(&h[..3]).unwrap();
    expect_error(&mut s, ErrorCode::Timeout);
    expect_closed(&mut s);

    let c = srv.handle.counters();
    assert!(c.errors(ErrorCode::FrameTooLarge) >= 1 && c.errors(ErrorCode::Timeout) >= 2);
    intact(&srv);
}

#[test]
fn idle_connections_and_limit() {
    // 1,000 in the issue; a smaller count keeps CI's thread and descriptor
    // use modest (MEMFS_TEST_IDLE_CONNS=1000 runs the full count).
    let n: usize = std::env::var("MEMFS_TEST_IDLE_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let cfg = ServerConfig {
        max_connections: n + 1,
        ..Default::default()
    };
    let (_tmp, srv) = setup(cfg);
    let idle: Vec<TcpStream> = (0..n)
        .map(|_| {
            let mut s = raw(&srv);
            hello(&mut s, 8);
            s
        })
        .collect();
    poll_until("idle connections counted", || {
        srv.handle.counters().connections_active.load(Relaxed) == n
    });
    // One more fits, the next is refused with a typed error.
    let mut last = raw(&srv);
    hello(&mut last, 8);
    let mut over = raw(&srv);
    let mut h = Vec::new();
    p::put_hello(&mut h, 8, Role::Read, b"", b"");
    let _ = over.write_all(&h);
    expect_error(&mut over, ErrorCode::TooManyConnections);
    drop(last);
    poll_until("a slot freed", || {
        srv.handle.counters().connections_active.load(Relaxed) == n
    });
    intact(&srv);
    drop(idle);
    poll_until("idle connections closed", || {
        srv.handle.counters().connections_active.load(Relaxed) == 0
    });
    intact(&srv);
}

#[test]
fn idle_timeout_closes_with_a_typed_error() {
    let cfg = ServerConfig {
        idle_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let (_tmp, srv) = setup(cfg);
    let mut s = raw(&srv);
    hello(&mut s, 8);
    assert!(expect_error(&mut s, ErrorCode::Timeout).contains("idle"));
    expect_closed(&mut s);
    intact(&srv);
}

#[test]
fn subscriber_that_stops_reading() {
    let cfg = ServerConfig {
        write_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let (_tmp, srv) = setup(cfg);
    let mut s = raw(&srv);
    let mut h = Vec::new();
    p::put_hello(&mut h, 8, Role::Follow, b"", b"");
    s.write_all(&h).unwrap();
    assert_eq!(read_frame(&mut s).unwrap().0, p::op::WELCOME);
    let mut sub = Vec::new();
    p::put_u64s(&mut sub, p::op::SUBSCRIBE, &[0, 0]);
    s.write_all(&sub).unwrap();
    poll_until("subscription", || {
        srv.handle.counters().subscribers_active.load(Relaxed) == 1
    });
    // The subscriber reads nothing while the writer commits far more than
    // the socket buffers hold.
    let mut w = srv.client("", "", Role::Write).unwrap();
    let big = vec![7u8; 60_000];
    let mut b = 2;
    while srv.handle.counters().subscribers_active.load(Relaxed) == 1 {
        let ops: Vec<([u8; 8], &[u8])> = (0..8).map(|i| (key(100 + i), &big[..])).collect();
        w.set(b, &ops).unwrap();
        b += 1;
        assert!(b < 2000, "the stuck subscriber was never dropped");
    }
    // The writer was never blocked for good, and the store is intact.
    w.set(b, &[(key(3), b"three")]).unwrap();
    intact_after(&srv, b);
}

fn intact_after(srv: &TestServer, block: u64) {
    let mut c = srv.client("", "", Role::Read).unwrap();
    assert_eq!(c.get(&key(1)).unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(c.get(&key(3)).unwrap().as_deref(), Some(&b"three"[..]));
    assert_eq!(c.status().unwrap().current, block);
}

#[test]
fn metrics_and_health_over_http() {
    let (_tmp, srv) = setup(ServerConfig::default());
    let (addr, _t) =
        memfs_store::net::server::serve_metrics(srv.handle.clone(), "127.0.0.1:0").unwrap();
    let get = |path: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        r
    };
    let m = get("/metrics");
    assert!(m.starts_with("HTTP/1.1 200"), "{m}");
    assert!(m.contains("\nmemfs_store_block 1\n"), "{m}");
    assert!(
        m.contains("memfs_store_errors_total{code=\"auth_failed\"} 0"),
        "{m}"
    );
    let h = get("/health");
    assert!(h.starts_with("HTTP/1.1 200") && h.ends_with("ok\n"), "{h}");
    assert!(get("/nope").starts_with("HTTP/1.1 404"));
}
