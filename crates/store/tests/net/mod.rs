//! Helpers for the network tests: a server in a thread, stopped and joined
//! by a Drop guard on every path; a self-signed TLS certificate.

#![allow(dead_code)]

use memfs_store::net::auth::Auth;
use memfs_store::net::client::{Client, ClientConfig, ClientError};
use memfs_store::net::follower::{self, FollowError, FollowerConfig, Progress};
use memfs_store::net::protocol::Role;
use memfs_store::net::server::{Server, ServerConfig, ShutdownHandle};
use memfs_store::{Durability, Store, StoreOptions};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const AUTH: &str = "r:rtok:read\nw:wtok:write\nf:ftok:follow\n";

pub fn create_store(dir: &Path, window: u64) {
    Store::create(
        dir,
        StoreOptions {
            key_width: 8,
            shards: 4,
            threads: 1,
            durability: Durability::None,
            rollback_window: window,
            snapshot_interval: 0,
            ..Default::default()
        },
    )
    .unwrap()
    .close()
    .unwrap();
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub handle: ShutdownHandle,
    thread: Option<JoinHandle<()>>,
    pub ca: Option<PathBuf>,
}

impl TestServer {
    pub fn start(dir: &Path, mut cfg: ServerConfig, tls_dir: Option<&Path>) -> TestServer {
        let ca = tls_dir.map(|d| {
            let (cert, key) = self_signed(d);
            cfg.tls = Some(memfs_store::net::server_tls(&cert, &key).unwrap());
            cert
        });
        let store = Store::open(dir).unwrap();
        let srv = Server::bind(store, "127.0.0.1:0", cfg).unwrap();
        let addr = srv.local_addr();
        let handle = srv.handle();
        let thread = std::thread::spawn(move || srv.run().expect("server run"));
        TestServer {
            addr,
            handle,
            thread: Some(thread),
            ca,
        }
    }

    pub fn client(&self, user: &str, token: &str, role: Role) -> Result<Client, ClientError> {
        Client::connect(self.config(user, token, role))
    }

    pub fn config(&self, user: &str, token: &str, role: Role) -> ClientConfig {
        let mut c = ClientConfig::new(self.addr.to_string(), role);
        c.user = user.into();
        c.token = token.into();
        c.io_timeout = Duration::from_secs(20);
        if let Some(ca) = &self.ca {
            c.tls = Some(memfs_store::net::client_tls(ca).unwrap());
            c.server_name = Some("localhost".into());
        }
        c
    }

    /// Shuts down and waits for the store to be closed.
    pub fn stop(mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn auth() -> Option<Arc<Auth>> {
    Some(Arc::new(Auth::parse(AUTH).unwrap()))
}

/// A certificate for `localhost` and 127.0.0.1, written as PEM into `dir`.
pub fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    (cert, key)
}

/// Polls `done` every few milliseconds for up to 30 s.
pub fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn key(i: u64) -> [u8; 8] {
    i.to_le_bytes()
}

/// A follower in a thread (in-memory replica journal), stopped and joined
/// on drop.
pub struct Follower {
    pub stop: Arc<AtomicBool>,
    pub progress: Arc<Progress>,
    pub thread: Option<JoinHandle<Result<(), FollowError>>>,
}

impl Follower {
    pub fn start(srv_cfg: memfs_store::net::client::ClientConfig, dir: &Path) -> Follower {
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Progress::default());
        let cfg = FollowerConfig {
            client: srv_cfg,
            dir: dir.to_path_buf(),
            durability: Durability::None,
            threads: 1,
            max_backoff: Duration::from_millis(200),
            on_caught_up: None,
        };
        let (s, pr) = (stop.clone(), progress.clone());
        let thread = Some(std::thread::spawn(move || follower::follow(cfg, &s, &pr)));
        Follower {
            stop,
            progress,
            thread,
        }
    }

    pub fn finish(mut self) -> Result<(), FollowError> {
        self.stop.store(true, Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A store's current block and every key and value (the store closed after).
pub fn contents(dir: &Path) -> (u64, BTreeMap<Vec<u8>, Vec<u8>>) {
    let s = Store::open(dir).unwrap();
    let mut m = BTreeMap::new();
    s.for_each(|k, v| {
        m.insert(k.to_vec(), v.to_vec());
    });
    let b = s.current_block();
    s.close().unwrap();
    (b, m)
}
