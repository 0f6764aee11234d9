//! Extreme offsets and sizes survive checkpoints and restarts, and a damaged
//! checkpoint never makes a data directory unmountable (issue 15, part 5).

use std::path::Path;

use memfs_durable::{self as durable, DurableFs, FsCheck};
use memfs_fs::{Ctx, FallocateMode, Fs, ROOT_INO, SetAttr};
use proptest::prelude::*;

mod common;
use common::{config, opts};

/// The largest file: the last byte a file can hold is at `MAX - 1`.
const MAX: u64 = i64::MAX as u64;
const PAGE: u64 = 4096;
/// The engine's copy_file_range chunk and the checkpoint's page slice.
const CHUNK: u64 = 1 << 20;
const SLICE: u64 = 64 * PAGE;

fn open(dir: &Path) -> (DurableFs, durable::OpenReport) {
    DurableFs::open(dir, config(), opts("none")).unwrap()
}

/// The offsets an engine accepts that sit on a boundary: 0, around pages,
/// checkpoint slices and copy chunks, and the very end of the largest file.
fn boundaries() -> Vec<u64> {
    let mut v = vec![0, 1];
    for b in [PAGE, SLICE, CHUNK, 1 << 32, 1 << 40, MAX - PAGE, MAX] {
        v.extend([b - 1, b]);
        if b < MAX {
            v.push(b + 1);
        }
    }
    v.push(MAX - 2);
    v.sort_unstable();
    v.dedup();
    v
}

fn fresh(fs: &Fs, name: &str) -> u64 {
    let ino = fs
        .create(Ctx::ROOT, ROOT_INO, name.as_bytes(), 0o644, true)
        .unwrap()
        .0
        .ino;
    fs.settle().unwrap();
    ino
}

/// Checks that what a restart rebuilds is exactly the live tree: once from
/// the journal alone, once from a checkpoint (the final one of a close).
fn assert_survives(dir: &Path, d: DurableFs) {
    let live = d.fs().canonical_dump();
    d.sync().unwrap();
    drop(d); // no checkpoint: the journal alone
    let (d, rep) = open(dir);
    assert!(rep.fell_back.is_none(), "{rep}");
    assert_eq!(d.fs().canonical_dump(), live, "after journal replay");
    d.close().unwrap(); // a final checkpoint
    let (d, rep) = open(dir);
    assert!(rep.fell_back.is_none(), "{rep}");
    assert_eq!(rep.journal.commits_replayed, 0, "{rep}");
    assert_eq!(d.fs().canonical_dump(), live, "after checkpoint load");
    assert!(d.fs().check_consistency().is_empty());
    d.close().unwrap();
}

#[test]
fn write_at_the_last_byte_survives_a_checkpoint() {
    // The reported case: `pwrite 0x7ffffffffffffffe 1`, unmount, mount.
    let t = tempfile::tempdir().unwrap();
    let (d, _) = open(t.path());
    let f = fresh(d.fs(), "f");
    d.fs().write(Ctx::ROOT, f, MAX - 1, b"z", false).unwrap();
    assert_eq!(d.fs().getattr(f).unwrap().size, MAX);
    assert_eq!(
        d.fs().write(Ctx::ROOT, f, MAX, b"z", false),
        Err(memfs_fs::Errno::EFBIG)
    );
    d.checkpoint().unwrap().expect("a checkpoint");
    assert_survives(t.path(), d);
    let (d, _) = open(t.path());
    let f = d.fs().resolve(ROOT_INO, "/f", true).unwrap();
    assert_eq!(d.fs().read_vec(f, MAX - 1, 8).unwrap(), b"z");
    d.close().unwrap();
}

#[test]
fn every_boundary_through_every_operation() {
    let t = tempfile::tempdir().unwrap();
    let (d, _) = open(t.path());
    let fs = d.fs().clone();
    let c = Ctx::ROOT;
    let offs = boundaries();
    for (i, &off) in offs.iter().enumerate() {
        // write: a short run that straddles the boundary where possible.
        let w = fresh(&fs, &format!("w{i}"));
        let start = off.saturating_sub(2);
        let len = (MAX - start).min(5) as usize;
        if len > 0 {
            fs.write(c, w, start, &vec![i as u8 + 1; len], false)
                .unwrap();
        }
        // truncate up to the boundary (sparse), then down again past a page.
        let tr = fresh(&fs, &format!("t{i}"));
        fs.write(c, tr, 0, &[7u8; 10], false).unwrap();
        let set = |size| SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(c, tr, &set(off)).unwrap();
        if off > PAGE + 3 {
            fs.write(c, tr, off - PAGE - 3, b"abc", false).unwrap();
            fs.setattr(c, tr, &set(off - 1)).unwrap();
        }
        // fallocate in every mode ending at the boundary.
        let fa = fresh(&fs, &format!("a{i}"));
        let flen = off.min(3 * PAGE);
        if flen > 0 {
            let foff = off - flen;
            fs.write(c, fa, foff, &[9u8; 100], false).unwrap();
            for (keep, punch, zero) in [
                (true, false, false),
                (true, true, false),
                (false, false, true),
                (false, false, false),
            ] {
                let mode = FallocateMode {
                    keep_size: keep,
                    punch_hole: punch,
                    zero_range: zero,
                };
                // Allocating real pages far out may hit the capacity:
                // ENOSPC is an answer, a panic or a bad image is not.
                match fs.fallocate(fa, foff, flen, mode) {
                    Ok(()) | Err(memfs_fs::Errno::ENOSPC) => {}
                    Err(e) => panic!("fallocate {foff}+{flen} {mode:?}: {e:?}"),
                }
            }
        }
        // copy_file_range from a short file to the boundary.
        let cp = fresh(&fs, &format!("c{i}"));
        let src = fresh(&fs, &format!("s{i}"));
        fs.write(c, src, 0, &[5u8; 3 * PAGE as usize + 1], false)
            .unwrap();
        let to = off.saturating_sub(PAGE + 1);
        // The kernel clamps the count to the largest file before FUSE sees it.
        let want = (3 * PAGE + 1).min(MAX - to);
        let n = fs
            .copy_file_range(c, src, 0, cp, to, want)
            .unwrap_or_else(|e| panic!("copy to {to}: {e:?}"));
        assert_eq!(n, want);
        fs.settle().unwrap();
    }
    d.checkpoint().unwrap().expect("a checkpoint");
    assert_survives(t.path(), d);
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_previous_one() {
    let t = tempfile::tempdir().unwrap();
    let (d, _) = open(t.path());
    let f = fresh(d.fs(), "f");
    d.fs().write(Ctx::ROOT, f, 0, b"first", false).unwrap();
    d.checkpoint().unwrap().expect("checkpoint 1");
    d.fs()
        .write(Ctx::ROOT, f, 1 << 20, b"second", false)
        .unwrap();
    let newest = d.checkpoint().unwrap().expect("checkpoint 2").info.commit;
    d.fs().write(Ctx::ROOT, f, 5, b"third", false).unwrap();
    let live = d.fs().canonical_dump();
    d.sync().unwrap();
    drop(d);
    // Damage a byte in the middle of the newest checkpoint.
    let snap = t
        .path()
        .join(memfs_durable::journal::checkpoint::checkpoint_file_name(
            newest,
        ));
    let mut bytes = std::fs::read(&snap).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&snap, &bytes).unwrap();

    let (d, rep) = open(t.path());
    let why = rep.fell_back.clone().expect("a fallback is reported");
    assert!(why.contains("damaged"), "{why}");
    assert_eq!(d.fs().canonical_dump(), live);
    d.close().unwrap();
    // The damaged file was set aside and a good checkpoint replaced it.
    assert!(!snap.exists());
    assert!(snap.with_extension("snap.damaged").exists());
    let (d, rep) = open(t.path());
    assert!(rep.fell_back.is_none(), "{rep}");
    assert_eq!(d.fs().canonical_dump(), live);
    d.close().unwrap();
}

#[test]
fn the_only_checkpoint_damaged_falls_back_to_the_whole_journal() {
    let t = tempfile::tempdir().unwrap();
    let (d, _) = open(t.path());
    let f = fresh(d.fs(), "f");
    d.fs().write(Ctx::ROOT, f, 3, b"data", false).unwrap();
    let live = d.fs().canonical_dump();
    d.close().unwrap();
    // Every checkpoint damaged (the empty one of creation and the final one).
    for e in std::fs::read_dir(t.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "snap") {
            let mut b = std::fs::read(&p).unwrap();
            let n = b.len();
            b[n - 12] ^= 1;
            std::fs::write(&p, &b).unwrap();
        }
    }
    let (d, rep) = open(t.path());
    assert!(rep.fell_back.is_some(), "{rep}");
    assert_eq!(d.fs().canonical_dump(), live);
    d.close().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        file: usize,
        off: u64,
        len: usize,
    },
    Truncate {
        file: usize,
        size: u64,
    },
    Fallocate {
        file: usize,
        off: u64,
        len: u64,
        mode: u8,
    },
    Copy {
        from: usize,
        to: usize,
        off_in: u64,
        off_out: u64,
        len: u64,
    },
    Checkpoint,
}

fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => proptest::sample::select(boundaries()),
        1 => any::<u64>().prop_map(|x| x % (MAX + 1)),
        1 => 0u64..3 * CHUNK,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, offset(), 1..6000usize)
            .prop_map(|(file, off, len)| Op::Write { file, off, len }),
        2 => (0..3usize, offset()).prop_map(|(file, size)| Op::Truncate { file, size }),
        2 => (0..3usize, offset(), 1..(4 * PAGE), 0..4u8)
            .prop_map(|(file, off, len, mode)| Op::Fallocate { file, off, len, mode }),
        2 => (0..3usize, 0..3usize, offset(), offset(), 1..(3 * PAGE))
            .prop_map(|(from, to, off_in, off_out, len)| Op::Copy { from, to, off_in, off_out, len }),
        1 => Just(Op::Checkpoint),
    ]
}

fn apply(d: &DurableFs, files: &[u64], op: &Op) {
    let fs = d.fs();
    let c = Ctx::ROOT;
    // Errors (EFBIG, EINVAL, ENOSPC) are answers; the property is that
    // whatever was accepted comes back identical after a restart.
    let _ = match *op {
        Op::Write { file, off, len } => fs
            .write(
                c,
                files[file],
                off,
                &vec![(off % 251) as u8 | 1; len],
                false,
            )
            .map(drop),
        Op::Truncate { file, size } => fs
            .setattr(
                c,
                files[file],
                &SetAttr {
                    size: Some(size),
                    ..Default::default()
                },
            )
            .map(drop),
        Op::Fallocate {
            file,
            off,
            len,
            mode,
        } => fs.fallocate(
            files[file],
            off,
            len,
            FallocateMode {
                keep_size: mode & 1 != 0,
                punch_hole: mode == 3,
                zero_range: mode == 2,
            },
        ),
        Op::Copy {
            from,
            to,
            off_in,
            off_out,
            len,
        } => fs
            .copy_file_range(c, files[from], off_in, files[to], off_out, len)
            .map(drop),
        Op::Checkpoint => d.checkpoint().map(drop).map_err(|e| panic!("{e}")),
    };
    fs.settle().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn extreme_operations_survive_checkpoint_and_load(ops in proptest::collection::vec(op(), 1..24)) {
        let t = tempfile::tempdir().unwrap();
        let (d, _) = open(t.path());
        let files: Vec<u64> = (0..3).map(|i| fresh(d.fs(), &format!("f{i}"))).collect();
        for o in &ops {
            apply(&d, &files, o);
        }
        let live = d.fs().canonical_dump();
        d.close().unwrap();
        let (d, rep) = open(t.path());
        prop_assert!(rep.fell_back.is_none(), "{}", rep);
        prop_assert_eq!(d.fs().canonical_dump(), live);
        d.close().unwrap();
    }
}
