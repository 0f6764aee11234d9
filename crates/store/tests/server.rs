//! The server over real sockets on 127.0.0.1: every request against a model,
//! plain and TLS, with each role's permissions.

mod net;

use memfs_store::net::protocol::{ErrorCode, Role};
use memfs_store::net::server::ServerConfig;
use net::{TestServer, auth, create_store, key};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::{BTreeMap, VecDeque};

const WINDOW: u64 = 4;
const KEYS: u64 = 24;

struct Model {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    states: BTreeMap<u64, BTreeMap<Vec<u8>, Vec<u8>>>,
    window: VecDeque<u64>,
    base: u64,
    current: u64,
    seq: u64,
}

impl Model {
    fn block(&mut self, b: u64, ops: &[(Vec<u8>, Vec<u8>)]) {
        for (k, v) in ops {
            if v.is_empty() {
                self.map.remove(k);
            } else {
                self.map.insert(k.clone(), v.clone());
            }
        }
        self.window.push_back(b);
        if self.window.len() as u64 > WINDOW {
            self.base = self.window.pop_front().unwrap();
        }
        self.current = b;
        self.seq += 1;
        self.states.insert(b, self.map.clone());
    }
}

fn run_model(tls: bool, seed: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    create_store(&dir, WINDOW);
    let cfg = ServerConfig {
        auth: auth(),
        ..Default::default()
    };
    let srv = TestServer::start(&dir, cfg, tls.then_some(tmp.path()));
    let mut w = srv.client("w", "wtok", Role::Write).unwrap();
    let mut r = srv.client("r", "rtok", Role::Read).unwrap();
    // A follow credential may read too; a write credential too.
    let mut fr = srv.client("f", "ftok", Role::Read).unwrap();
    assert!(srv.client("w", "wtok", Role::Read).is_ok());

    // Permissions.
    let no = |e: memfs_store::net::client::ClientError| e.code();
    assert_eq!(
        no(r.set(1, &[(key(1), b"x")]).unwrap_err()),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(no(r.rollback(0).unwrap_err()), Some(ErrorCode::Forbidden));
    assert_eq!(
        no(r.pop(1, &key(1)).unwrap_err()),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!(
        no(fr.set(1, &[(key(1), b"x")]).unwrap_err()),
        Some(ErrorCode::Forbidden)
    );
    // Only a follow session reports a follower's position.
    assert_eq!(no(r.ack(0).unwrap_err()), Some(ErrorCode::Forbidden));
    assert_eq!(no(w.ack(0).unwrap_err()), Some(ErrorCode::Forbidden));
    for (u, t, role) in [
        ("r", "rtok", Role::Write),
        ("r", "rtok", Role::Follow),
        ("w", "wtok", Role::Follow),
        ("f", "ftok", Role::Write),
    ] {
        let e = srv.client(u, t, role).err().expect("refused");
        assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{u} as {role}: {e}");
        assert!(e.to_string().contains("does not allow"), "{e}");
    }
    for (u, t) in [("r", "wtok"), ("nobody", "rtok"), ("w", ""), ("", "")] {
        let e = srv.client(u, t, Role::Read).err().expect("refused");
        assert_eq!(e.code(), Some(ErrorCode::AuthFailed), "{u}:{t}: {e}");
    }
    // A subscription of a read session is refused, the session goes on.
    let mut sub_r = srv
        .client("r", "rtok", Role::Read)
        .unwrap()
        .subscribe(0, 0)
        .unwrap();
    assert_eq!(
        sub_r.next_event().unwrap_err().code(),
        Some(ErrorCode::Forbidden)
    );

    let mut m = Model {
        map: BTreeMap::new(),
        states: BTreeMap::from([(0, BTreeMap::new())]),
        window: VecDeque::new(),
        base: 0,
        current: 0,
        seq: 0,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut buf = Vec::new();
    for step in 0..80 {
        match rng.random_range(0..10) {
            0..=3 => {
                let b = m.current + rng.random_range(1..4);
                let ops: Vec<(Vec<u8>, Vec<u8>)> = (0..rng.random_range(0..6))
                    .map(|_| {
                        let len = rng.random_range(0..12);
                        (
                            key(rng.random_range(0..KEYS)).to_vec(),
                            vec![rng.random::<u8>() | 1; len],
                        )
                    })
                    .collect();
                let seq = w.set(b, &ops).unwrap();
                m.block(b, &ops);
                assert_eq!(seq, m.seq, "step {step}");
            }
            4 => {
                let k = key(rng.random_range(0..KEYS));
                let b = m.current + 1;
                let old = w.pop(b, &k).unwrap();
                assert_eq!(old.as_ref(), m.map.get(k.as_slice()), "step {step}");
                m.block(b, &[(k.to_vec(), vec![])]);
            }
            5 => {
                let t = rng.random_range(m.current.saturating_sub(WINDOW + 3)..=m.current + 1);
                let res = w.rollback(t);
                if t < m.base || t > m.current {
                    assert_eq!(
                        res.unwrap_err().code(),
                        Some(ErrorCode::RollbackOutsideWindow),
                        "step {step}"
                    );
                } else {
                    while m.window.back().is_some_and(|&b| b > t) {
                        m.window.pop_back();
                    }
                    let now = m.window.back().copied().unwrap_or(m.base);
                    if now != m.current {
                        m.seq += 1;
                    }
                    m.current = now;
                    m.map = m.states[&now].clone();
                    assert_eq!(res.unwrap(), now, "step {step}");
                }
            }
            6 => {
                if m.current > 0 {
                    let e = w.set(m.current, &[(key(1), b"z")]).unwrap_err();
                    assert_eq!(e.code(), Some(ErrorCode::BlockNotIncreasing), "step {step}");
                }
            }
            7 => {
                for i in 0..KEYS {
                    let present = r.get_into(&key(i), &mut buf).unwrap();
                    assert_eq!(
                        present.then_some(&buf),
                        m.map.get(key(i).as_slice()),
                        "step {step}"
                    );
                }
            }
            8 => {
                let keys: Vec<[u8; 8]> = (0..KEYS).map(key).collect();
                let got = fr.multi_get(&keys).unwrap();
                for (i, v) in got.iter().enumerate() {
                    assert_eq!(v.as_ref(), m.map.get(keys[i].as_slice()), "step {step}");
                }
                r.get_pipelined(&keys, |i, v| {
                    assert_eq!(v, m.map.get(keys[i].as_slice()).map(|v| v.as_slice()));
                })
                .unwrap();
            }
            _ => {
                let s = r.status().unwrap();
                assert_eq!(
                    (s.current, s.oldest, s.last_seq),
                    (m.current, m.base, m.seq),
                    "step {step}"
                );
                r.ping().unwrap();
            }
        }
    }
    // The event stream replays to the same state.
    let f = srv.client("f", "ftok", Role::Follow).unwrap();
    let mut sub = f.subscribe(0, 0).unwrap();
    let mut state: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut states = BTreeMap::from([(0u64, state.clone())]);
    let mut n = 0;
    while n < m.seq {
        match sub.next_event().unwrap() {
            memfs_store::net::client::Event::Block {
                seq,
                block,
                entries,
                ..
            } => {
                n += 1;
                assert_eq!(seq, n);
                for (k, v) in memfs_store::net::protocol::entries(entries, 8) {
                    if v.is_empty() {
                        state.remove(k);
                    } else {
                        state.insert(k.to_vec(), v.to_vec());
                    }
                }
                states.insert(block, state.clone());
            }
            memfs_store::net::client::Event::Rollback { seq, result, .. } => {
                n += 1;
                assert_eq!(seq, n);
                state = states[&result].clone();
            }
            memfs_store::net::client::Event::Heartbeat { .. } => {}
        }
    }
    assert_eq!(state, m.map);
    drop(sub);
    srv.stop();
    // Everything is durable after a graceful stop.
    let s = memfs_store::Store::open(&dir).unwrap();
    assert_eq!(s.current_block(), m.current);
    let mut all = BTreeMap::new();
    s.for_each(|k, v| {
        all.insert(k.to_vec(), v.to_vec());
    });
    assert_eq!(all, m.map);
}

#[test]
fn model_plain() {
    run_model(false, 1);
}

#[test]
fn model_tls() {
    run_model(true, 2);
}

#[test]
fn plain_tcp_only_on_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    create_store(tmp.path(), 4);
    let store = memfs_store::Store::open(tmp.path()).unwrap();
    let e = memfs_store::net::server::Server::bind(store, "0.0.0.0:0", ServerConfig::default())
        .err()
        .expect("refused");
    assert!(e.to_string().contains("--insecure"), "{e}");
    // The store was dropped (closed) with the refused server: it opens again.
    let store = memfs_store::Store::open(tmp.path()).unwrap();
    let cfg = ServerConfig {
        insecure: true,
        ..Default::default()
    };
    let srv = memfs_store::net::server::Server::bind(store, "0.0.0.0:0", cfg).unwrap();
    drop(srv);
}

#[test]
fn tls_client_refuses_unknown_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    create_store(&dir, 4);
    let srv = TestServer::start(&dir, ServerConfig::default(), Some(tmp.path()));
    let other = tempfile::tempdir().unwrap();
    let (other_cert, _) = net::self_signed(other.path());
    let mut cfg = srv.config("", "", Role::Read);
    cfg.tls = Some(memfs_store::net::client_tls(&other_cert).unwrap());
    let e = memfs_store::net::client::Client::connect(cfg)
        .err()
        .expect("refused");
    assert!(
        e.to_string().to_lowercase().contains("certificate")
            || e.to_string().contains("connection"),
        "{e}"
    );
    // A plain client against the TLS port gets no WELCOME either.
    let mut plain = srv.config("", "", Role::Read);
    plain.tls = None;
    plain.io_timeout = std::time::Duration::from_secs(3);
    assert!(memfs_store::net::client::Client::connect(plain).is_err());
    // And the server still serves TLS clients.
    srv.client("", "", Role::Read).unwrap().ping().unwrap();
}

#[test]
fn client_reconnects_and_pool_reuses() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    create_store(&dir, 4);
    let cfg = ServerConfig {
        idle_timeout: std::time::Duration::from_millis(100),
        ..Default::default()
    };
    let srv = TestServer::start(&dir, cfg, None);
    let mut w = srv.client("", "", Role::Write).unwrap();
    w.set(1, &[(key(1), b"a")]).unwrap();
    let total = || {
        srv.handle
            .counters()
            .connections_total
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = total();
    // The server closes the idle connection; the next read and the next write
    // go through on a new one.
    net::poll_until("the idle connection closed", || {
        srv.handle
            .counters()
            .connections_active
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    });
    assert_eq!(w.get(&key(1)).unwrap().as_deref(), Some(&b"a"[..]));
    net::poll_until("closed again", || {
        srv.handle
            .counters()
            .connections_active
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    });
    w.set(2, &[(key(2), b"b")]).unwrap();
    assert_eq!(total(), before + 2);
    drop(w);
    srv.stop();
    // The pool hands back the same connection while it is healthy.
    let srv = TestServer::start(&dir, ServerConfig::default(), None);
    let total = || {
        srv.handle
            .counters()
            .connections_total
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let pool = memfs_store::net::client::Pool::new(srv.config("", "", Role::Read), 4);
    {
        let mut a = pool.get().unwrap();
        let mut b = pool.get().unwrap();
        assert_eq!(a.get(&key(2)).unwrap().as_deref(), Some(&b"b"[..]));
        b.ping().unwrap();
    }
    assert_eq!(pool.idle(), 2);
    let n = total();
    pool.get().unwrap().ping().unwrap();
    assert_eq!(total(), n, "a pooled connection was reused");
    // A key of the wrong width is refused before anything is sent.
    let e = pool.get().unwrap().get(&[1u8; 3]).unwrap_err();
    assert!(e.to_string().contains("3 bytes"), "{e}");
}
