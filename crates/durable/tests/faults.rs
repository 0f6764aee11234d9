//! A durable file system whose data directory's disk fills up (a real small
//! tmpfs): operations fail with ENOSPC and change nothing, reads keep
//! working, writes work again once space is freed, and a restart finds
//! exactly what was acknowledged (issue 15, part 1).

use std::io::Write;
use std::path::{Path, PathBuf};

use memfs_durable::{self as durable, DurableFs, FsCheck};
use memfs_fs::{Ctx, Errno, ROOT_INO};

mod common;
use common::{config, opts};

/// A tmpfs of `size` mounted on a temporary directory, unmounted on drop
/// (panics included).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .ok()?;
        st.success().then_some(Tmpfs { dir })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the disk with a file until only `left` bytes are free; returns
/// its path.
fn fill(dir: &Path, left: u64) -> PathBuf {
    let p = dir.join("ballast");
    let mut f = std::fs::File::create(&p).unwrap();
    let chunk = vec![1u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    let len = f.metadata().unwrap().len();
    f.set_len(len.saturating_sub(left)).unwrap();
    p
}

#[test]
fn a_full_disk_gives_enospc_changes_nothing_and_recovers() {
    let Some(t) = Tmpfs::mount("8m") else {
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        return;
    };
    let data = t.path().join("data");
    let (d, _) = DurableFs::open(&data, config(), opts("sync")).unwrap();
    let fs = d.fs().clone();
    let c = Ctx::ROOT;
    let body = vec![7u8; 48 << 10];
    let ballast = fill(&t.path(), 2 << 20);
    let mut acked = Vec::new();
    let mut refused = 0;
    for i in 0..400 {
        let before = fs.canonical_dump();
        let name = format!("f{i}");
        let r = fs
            .create(c, ROOT_INO, name.as_bytes(), 0o644, true)
            .and_then(|(a, _)| {
                fs.settle()?;
                fs.write(c, a.ino, 0, &body, false)?;
                fs.settle()
            });
        match r {
            Ok(()) => acked.push(name),
            Err(e) => {
                assert_eq!(e, Errno::ENOSPC, "op {i}");
                refused += 1;
                // Only the step that failed is missing: the create may have
                // been acknowledged with the write refused.
                let after = fs.canonical_dump();
                if after != before {
                    let f = fs.resolve(ROOT_INO, &format!("/{name}"), true).unwrap();
                    assert_eq!(fs.getattr(f).unwrap().size, 0, "a refused write left data");
                    acked.push(name);
                }
                if refused >= 20 {
                    break;
                }
            }
        }
    }
    assert!(
        refused >= 20,
        "the disk never filled ({} files)",
        acked.len()
    );
    assert!(
        acked.len() >= 10,
        "only {} operations before the disk filled",
        acked.len()
    );
    eprintln!(
        "{} operations acknowledged before the disk filled, {refused} refused",
        acked.len()
    );
    // Reads, stat and readdir keep working.
    let first = fs.resolve(ROOT_INO, "/f0", true);
    if let Ok(f) = first {
        assert_eq!(
            fs.read_vec(f, 0, 16).unwrap().len(),
            16.min(fs.getattr(f).unwrap().size as usize)
        );
    }
    let mut n = 0;
    fs.readdir(ROOT_INO, 0, |_| {
        n += 1;
        true
    })
    .unwrap();
    assert_eq!(n, acked.len() + 2);
    // Space freed: writes work again without a reopen.
    std::fs::remove_file(&ballast).unwrap();
    let (a, _) = fs.create(c, ROOT_INO, b"after", 0o644, true).unwrap();
    fs.write(c, a.ino, 0, &body, false).unwrap();
    fs.settle().unwrap();
    let live = fs.canonical_dump();
    drop(fs);
    drop(d);
    let (d, rep) = DurableFs::open(&data, config(), opts("sync")).unwrap();
    assert_eq!(d.fs().canonical_dump(), live, "{rep}");
    d.close().unwrap();
}

// ---- simulated disk: one fault at a random point, checked against a model

use std::sync::Arc;

use memfs_journal::storage::register_scoped;
use memfs_journal::{RecoverMode, SimStorage};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// One engine operation on a few colliding names, then `settle` (the
/// reply): its result is what the caller is told.
fn one_op(fs: &memfs_fs::Fs, rng: &mut StdRng) -> memfs_fs::Result<()> {
    let c = Ctx::ROOT;
    let name = format!("n{}", rng.random_range(0..5));
    let r = match rng.random_range(0..6) {
        0 => fs.mkdir(c, ROOT_INO, name.as_bytes(), 0o755).map(drop),
        1 | 2 => match fs.lookup_noref(ROOT_INO, name.as_bytes()) {
            Ok(a) if a.kind == memfs_fs::FileType::RegularFile => {
                let len = rng.random_range(1..20_000);
                fs.write(
                    c,
                    a.ino,
                    rng.random_range(0..50_000),
                    &vec![3u8; len],
                    false,
                )
                .map(drop)
            }
            _ => fs
                .create(c, ROOT_INO, name.as_bytes(), 0o644, false)
                .map(drop),
        },
        3 => fs.unlink(ROOT_INO, name.as_bytes()),
        4 => fs.rmdir(ROOT_INO, name.as_bytes()),
        _ => {
            let to = format!("n{}", rng.random_range(0..5));
            fs.rename(
                ROOT_INO,
                name.as_bytes(),
                ROOT_INO,
                to.as_bytes(),
                memfs_fs::RenameFlags::default(),
            )
        }
    };
    let s = fs.settle();
    r.and(s)
}

#[test]
fn simulated_faults_at_random_points_keep_memory_and_journal_in_step() {
    let cases: u64 = std::env::var("MEMFS_FAULT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let (mut nospace, mut eio) = (0, 0);
    for seed in 0..cases {
        let mut rng = StdRng::seed_from_u64(seed);
        let sim = SimStorage::new();
        let prefix = PathBuf::from(format!("/memfs-faults/{seed}"));
        let reg = register_scoped(&prefix, Arc::new(sim.clone()));
        let dir = prefix.join("data");
        let mut o = opts("sync");
        o.segment_size = 64 << 10; // rotations into preallocated spares
        let (d, _) = DurableFs::open(&dir, config(), o.clone()).unwrap();
        let fs = d.fs().clone();
        let fault_at = rng.random_range(0..60);
        let fault = rng.random_range(0..4);
        let mut acked = fs.canonical_dump();
        let mut unknown = None;
        let mut read_only = false;
        for i in 0..80 {
            if i == fault_at {
                match fault {
                    0 => sim.fail_next_alloc(libc::ENOSPC),
                    1 => sim.fail_next_write(libc::EIO),
                    2 => sim.fail_next_sync(libc::EIO),
                    _ => sim.fail_next_write(libc::ENOSPC),
                }
            }
            let before = fs.canonical_dump();
            match one_op(&fs, &mut rng) {
                Ok(()) => {
                    assert!(
                        !read_only,
                        "seed {seed}: a change was accepted after a failure"
                    );
                    acked = fs.canonical_dump();
                }
                Err(e) if e == Errno::ENOSPC => {
                    nospace += 1;
                    assert_eq!(
                        fs.canonical_dump(),
                        before,
                        "seed {seed}: ENOSPC changed memory"
                    );
                }
                Err(e) if e == Errno::EIO => {
                    // Durability unknown: this change may or may not survive.
                    eio += 1;
                    assert!(!read_only);
                    read_only = true;
                    unknown = Some(fs.canonical_dump());
                }
                Err(e) if e == Errno(libc::EROFS) => {
                    assert!(read_only, "seed {seed}: EROFS before any failure");
                    assert_eq!(
                        fs.canonical_dump(),
                        before,
                        "seed {seed}: EROFS changed memory"
                    );
                }
                Err(_) => assert_eq!(fs.canonical_dump(), before),
            }
        }
        assert_eq!(d.read_only_reason().is_some(), read_only, "seed {seed}");
        // The marker that tells fsck and the next open (the one-shot fault
        // is over, so it could be written).
        assert_eq!(
            durable::read_only_marker(&dir).unwrap().is_some(),
            read_only,
            "seed {seed}: READ-ONLY marker"
        );
        // Reads keep working in every case.
        fs.readdir(ROOT_INO, 0, |_| true).unwrap();
        drop(fs);
        drop(d);
        // A restart after a power cut: only what was synced is on the disk.
        reg.replace(Arc::new(sim.recover(RecoverMode::DropAll, seed)));
        let (d, rep) = DurableFs::open(&dir, config(), o).unwrap();
        let got = d.fs().canonical_dump();
        assert_eq!(rep.previous_read_only.is_some(), read_only, "seed {seed}");
        assert!(durable::read_only_marker(&dir).unwrap().is_none());
        assert!(
            got == acked || Some(&got) == unknown.as_ref(),
            "seed {seed}: after restart ({rep}) the tree is neither the acknowledged one nor the one with the failed operation"
        );
        d.close().unwrap();
    }
    eprintln!("{cases} cases: {nospace} ENOSPC refusals, {eio} EIO failures");
    assert!(nospace > 0 && eio > 0);
}
