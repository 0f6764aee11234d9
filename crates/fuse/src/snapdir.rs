//! `M/.snapshots/NAME/`: the engine's copy-on-write snapshots, shown
//! read-only inside the mount (docs/snapshots.md, "Browsing").
//!
//! The kernel knows every node by one 64-bit node id, so the ids of the
//! live tree and of every snapshot must not collide:
//!
//! - live node `i` keeps id `i` (`i < 2^40`: the engine hands out inode
//!   numbers from a counter, so a mount would have to create 2^40 nodes
//!   first; a larger one is refused with EOVERFLOW rather than aliased);
//! - node `i` of the snapshot in slot `s` is `(s << 40) | i`, `1 <= s < 2^23`;
//! - `.snapshots` itself is [`SNAPDIR`] (`2^63`, outside both ranges).
//!
//! A slot is given to a snapshot the first time the kernel sees it and is
//! never given again during the mount's life: a handle of a deleted snapshot
//! (an open descriptor, a cwd) can only name a slot that no longer maps to
//! anything, and answers ESTALE, never the content of a newer snapshot.
//! The node ids also serve as the inode numbers `stat` shows, so `find`,
//! `cp -a` and `diff -r` see distinct files in distinct snapshots.

use std::collections::HashMap;

use memfs_fs::{Errno, ROOT_INO};
use parking_lot::Mutex;

pub const SLOT_SHIFT: u32 = 40;
/// Largest live inode number the adapter can serve.
pub const INO_MASK: u64 = (1 << SLOT_SHIFT) - 1;
/// Slots are `1..MAX_SLOTS`.
pub const MAX_SLOTS: u64 = 1 << 23;
/// The node id of `.snapshots`.
pub const SNAPDIR: u64 = 1 << 63;
/// The readdir offset after `.snapshots` in a listing of the root (the
/// engine's own offsets stay far below).
pub const SNAPDIR_ENTRY_OFFSET: u64 = u64::MAX - 1;

/// What a node id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Live(u64),
    SnapDir,
    /// Inode `ino` of the snapshot in `slot`.
    Snap {
        slot: u64,
        ino: u64,
    },
}

pub fn classify(nodeid: u64) -> Node {
    if nodeid == SNAPDIR {
        Node::SnapDir
    } else if nodeid <= INO_MASK {
        Node::Live(nodeid)
    } else {
        Node::Snap {
            slot: nodeid >> SLOT_SHIFT,
            ino: nodeid & INO_MASK,
        }
    }
}

/// The node id of inode `ino` of the snapshot in `slot`.
pub fn snap_nodeid(slot: u64, ino: u64) -> Result<u64, Errno> {
    if ino > INO_MASK {
        return Err(Errno::EOVERFLOW);
    }
    Ok((slot << SLOT_SHIFT) | ino)
}

/// The snapshot root's node id in `slot`.
pub fn snap_root(slot: u64) -> u64 {
    (slot << SLOT_SHIFT) | ROOT_INO
}

/// Snapshot ids (the engine's) to slots (ours) and back.
#[derive(Default)]
pub struct Slots {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<u64, u64>,
    by_slot: HashMap<u64, u64>,
    /// Last slot given; slots are never given twice.
    last: u64,
}

impl Slots {
    /// The slot of snapshot `id`, given now if it has none.
    pub fn slot_of(&self, id: u64) -> Result<u64, Errno> {
        let mut g = self.inner.lock();
        if let Some(&s) = g.by_id.get(&id) {
            return Ok(s);
        }
        if g.last + 1 >= MAX_SLOTS {
            return Err(Errno::ENOSPC);
        }
        g.last += 1;
        let s = g.last;
        g.by_id.insert(id, s);
        g.by_slot.insert(s, id);
        Ok(s)
    }

    /// The snapshot id in `slot`; ESTALE once it was forgotten.
    pub fn id_of(&self, slot: u64) -> Result<u64, Errno> {
        self.inner
            .lock()
            .by_slot
            .get(&slot)
            .copied()
            .ok_or(Errno::ESTALE)
    }

    /// Snapshot `id` was deleted: its slot is retired.
    pub fn forget_id(&self, id: u64) {
        let mut g = self.inner.lock();
        if let Some(s) = g.by_id.remove(&id) {
            g.by_slot.remove(&s);
        }
    }

    /// The served tree was replaced (a durable rollback): every snapshot id
    /// belonged to the old tree. Slots stay used.
    pub fn forget_all(&self) {
        let mut g = self.inner.lock();
        g.by_id.clear();
        g.by_slot.clear();
    }
}

/// Checks a name for `.snapshots` (`-o snapdir_name=`).
pub fn check_dir_name(name: &[u8]) -> Result<(), String> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(format!(
            "invalid snapshot directory name {:?}: one path component, not . or ..",
            String::from_utf8_lossy(name)
        ));
    }
    if name.len() > 255 || name.contains(&0) {
        return Err("invalid snapshot directory name: at most 255 bytes, no NUL".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_do_not_collide() {
        assert_eq!(classify(1), Node::Live(1));
        assert_eq!(classify(INO_MASK), Node::Live(INO_MASK));
        assert_eq!(classify(SNAPDIR), Node::SnapDir);
        let id = snap_nodeid(5, 77).unwrap();
        assert_eq!(classify(id), Node::Snap { slot: 5, ino: 77 });
        assert_eq!(
            classify(snap_root(MAX_SLOTS - 1)),
            Node::Snap {
                slot: MAX_SLOTS - 1,
                ino: 1
            }
        );
        assert!(snap_root(MAX_SLOTS - 1) < SNAPDIR);
        assert_eq!(snap_nodeid(1, INO_MASK + 1), Err(Errno::EOVERFLOW));
    }

    #[test]
    fn slots_are_never_given_twice() {
        let s = Slots::default();
        let a = s.slot_of(10).unwrap();
        assert_eq!(s.slot_of(10).unwrap(), a);
        assert_eq!(s.id_of(a).unwrap(), 10);
        s.forget_id(10);
        assert_eq!(s.id_of(a), Err(Errno::ESTALE));
        let b = s.slot_of(10).unwrap();
        assert_ne!(a, b);
        s.forget_all();
        assert_eq!(s.id_of(b), Err(Errno::ESTALE));
        assert!(s.slot_of(10).unwrap() > b);
    }

    #[test]
    fn dir_names() {
        assert!(check_dir_name(b".snapshots").is_ok());
        assert!(check_dir_name(b".zfs").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b"] {
            assert!(check_dir_name(bad).is_err());
        }
    }
}
