//! Shared by the durable file system tests.

#![allow(dead_code)]

use std::path::Path;

use memfs_durable::{self as durable, DurableFs, Options};
use memfs_fs::{Config, Ctx, Fs, ROOT_INO, RenameFlags, SetAttr, XattrMode};
use rand::{Rng, rngs::StdRng};

pub fn config() -> Config {
    Config {
        capacity: 1 << 30,
        max_inodes: 1 << 20,
    }
}

/// Durability `mode`, no timed checkpoints, every commit kept, 1 MiB segments.
pub fn opts(mode: &str) -> Options {
    Options {
        durability: durable::parse_durability(mode).unwrap(),
        checkpoint_interval: None,
        checkpoint_bytes: u64::MAX,
        retention: "all".parse().unwrap(),
        segment_size: 1 << 20,
    }
}

/// Opens (or creates) the durable file system in `dir` with [`opts`].
pub fn open_mode(dir: &Path, mode: &str) -> DurableFs {
    DurableFs::open(dir, config(), opts(mode)).unwrap().0
}

/// Random operations on a few names, so that creates, renames over,
/// unlinks and writes collide on the same entries and nodes.
pub fn random_op(fs: &Fs, rng: &mut StdRng) -> memfs_fs::Result<()> {
    let c = Ctx::ROOT;
    let dirs = ["/", "/p", "/q", "/p/r"];
    let dir = dirs[rng.random_range(0..dirs.len())];
    let Ok(d) = fs.resolve(ROOT_INO, dir, true) else {
        return fs.settle();
    };
    let name = format!("n{}", rng.random_range(0..6));
    let _ = match rng.random_range(0..10) {
        0 => fs
            .mkdir(c, d, name.as_bytes(), 0o755)
            .map(|a| fs.forget(a.ino, 1)),
        1 | 2 => fs
            .write_file(
                c,
                d,
                &name,
                &vec![rng.random(); rng.random_range(0..20_000)],
            )
            .map(|_| ()),
        3 => fs.unlink(d, name.as_bytes()),
        4 => fs.rmdir(d, name.as_bytes()),
        5 => {
            let to = dirs[rng.random_range(0..dirs.len())];
            match fs.resolve(ROOT_INO, to, true) {
                Ok(t) => fs.rename(
                    d,
                    name.as_bytes(),
                    t,
                    format!("n{}", rng.random_range(0..6)).as_bytes(),
                    RenameFlags::default(),
                ),
                Err(e) => Err(e),
            }
        }
        6 => fs.lookup_noref(d, name.as_bytes()).and_then(|a| {
            fs.write(
                c,
                a.ino,
                rng.random_range(0..50_000),
                &[rng.random(); 3000],
                false,
            )
            .map(|_| ())
        }),
        7 => fs.lookup_noref(d, name.as_bytes()).and_then(|a| {
            fs.setattr(
                c,
                a.ino,
                &SetAttr {
                    size: Some(rng.random_range(0..30_000)),
                    mode: Some(0o600),
                    ..Default::default()
                },
            )
            .map(|_| ())
        }),
        8 => fs
            .lookup_noref(d, name.as_bytes())
            .and_then(|a| fs.setxattr(a.ino, b"user.k", &[rng.random(); 10], XattrMode::Any)),
        _ => fs.lookup_noref(d, name.as_bytes()).and_then(|a| {
            fs.link(
                a.ino,
                ROOT_INO,
                format!("l{}", rng.random_range(0..4)).as_bytes(),
            )
            .map(|a2| fs.forget(a2.ino, 1))
        }),
    };
    // What the FUSE adapter does after every request.
    fs.settle()
}
