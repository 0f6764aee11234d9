//! POSIX record locks and BSD flock locks of one inode.
//!
//! Owners are opaque 64-bit ids (the kernel's lock owner: a process's file
//! table for classic POSIX locks, an open file description for OFD locks and
//! flock). A blocked request does not hold a thread: it is parked as a waiter
//! with a completion callback that runs when the range is released, so a
//! server with a handful of threads can have any number of sleepers.

use crate::{Errno, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RangeLock {
    pub start: u64,
    /// Inclusive.
    pub end: u64,
    pub write: bool,
    pub owner: u64,
    pub pid: u32,
}

impl RangeLock {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

/// Called once with the outcome of a blocking request.
pub type LockCallback = Box<dyn FnOnce(Result<()>) + Send>;

/// Which lock family a request belongs to; they never conflict with each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    Posix,
    Flock,
}

pub(crate) struct Waiter {
    family: Family,
    req: RangeLock,
    /// The caller's name for this wait, to cancel it (a FUSE request id).
    token: u64,
    // In a mutex only to make the table Sync; it is never contended.
    done: parking_lot::Mutex<LockCallback>,
}

#[derive(Default)]
pub(crate) struct LockTable {
    posix: Vec<RangeLock>,
    flock: Vec<RangeLock>,
    waiters: Vec<Waiter>,
}

impl LockTable {
    pub fn is_empty(&self) -> bool {
        self.posix.is_empty() && self.flock.is_empty() && self.waiters.is_empty()
    }

    fn list(&self, family: Family) -> &Vec<RangeLock> {
        match family {
            Family::Posix => &self.posix,
            Family::Flock => &self.flock,
        }
    }

    fn list_mut(&mut self, family: Family) -> &mut Vec<RangeLock> {
        match family {
            Family::Posix => &mut self.posix,
            Family::Flock => &mut self.flock,
        }
    }

    /// The first lock of another owner that conflicts with `req`.
    pub fn conflict(&self, family: Family, req: &RangeLock) -> Option<RangeLock> {
        self.list(family)
            .iter()
            .find(|l| {
                l.owner != req.owner && l.overlaps(req.start, req.end) && (l.write || req.write)
            })
            .copied()
    }

    /// Sets (or with `typ == None`, clears) `owner`'s lock over the range, with
    /// POSIX semantics: existing locks of the same owner are split, replaced
    /// and merged. Returns callbacks of waiters granted as a result; the caller
    /// runs them after dropping the inode lock.
    pub fn apply(
        &mut self,
        family: Family,
        req: RangeLock,
        set: bool,
    ) -> Vec<(LockCallback, Result<()>)> {
        self.set_range(family, req, set);
        self.grant_waiters()
    }

    /// The lock-list edit of [`LockTable::apply`], without granting waiters.
    fn set_range(&mut self, family: Family, req: RangeLock, set: bool) {
        let list = self.list_mut(family);
        let mut out = Vec::with_capacity(list.len() + 2);
        for l in list.drain(..) {
            if l.owner != req.owner || !l.overlaps(req.start, req.end) {
                out.push(l);
                continue;
            }
            if l.start < req.start {
                out.push(RangeLock {
                    end: req.start - 1,
                    ..l
                });
            }
            if l.end > req.end {
                out.push(RangeLock {
                    start: req.end + 1,
                    ..l
                });
            }
        }
        if set {
            let mut new = req;
            // Merge adjacent or overlapping locks of the same owner and type.
            out.retain(|l| {
                let touches = l.owner == new.owner
                    && l.write == new.write
                    && l.start <= new.end.saturating_add(1)
                    && new.start <= l.end.saturating_add(1);
                if touches {
                    new.start = new.start.min(l.start);
                    new.end = new.end.max(l.end);
                }
                !touches
            });
            out.push(new);
        }
        *self.list_mut(family) = out;
    }

    /// Drops every lock and waiter of `owner` in `family`.
    pub fn release_owner(&mut self, family: Family, owner: u64) -> Vec<(LockCallback, Result<()>)> {
        self.list_mut(family).retain(|l| l.owner != owner);
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].family == family && self.waiters[i].req.owner == owner {
                let w = self.waiters.remove(i);
                done.push((w.done.into_inner(), Err(Errno::EINTR)));
            } else {
                i += 1;
            }
        }
        done.extend(self.grant_waiters());
        done
    }

    pub fn park(&mut self, family: Family, req: RangeLock, token: u64, done: LockCallback) {
        self.waiters.push(Waiter {
            family,
            req,
            token,
            done: parking_lot::Mutex::new(done),
        });
    }

    /// Drops every lock and answers every waiter with `err`: the file the
    /// table belonged to is gone.
    pub fn abandon(self, err: Errno) -> Vec<(LockCallback, Result<()>)> {
        self.waiters
            .into_iter()
            .map(|w| (w.done.into_inner(), Err(err)))
            .collect()
    }

    /// Withdraws the wait named `token`, returning its callback.
    pub fn cancel(&mut self, token: u64) -> Option<LockCallback> {
        let i = self.waiters.iter().position(|w| w.token == token)?;
        Some(self.waiters.remove(i).done.into_inner())
    }

    /// Owners some waiter of `owner` is blocked by (for deadlock detection).
    pub fn blockers_of(&self, owner: u64) -> Vec<u64> {
        self.waiters
            .iter()
            .filter(|w| w.req.owner == owner)
            .filter_map(|w| self.conflict(w.family, &w.req).map(|l| l.owner))
            .collect()
    }

    fn grant_waiters(&mut self) -> Vec<(LockCallback, Result<()>)> {
        let mut granted = Vec::new();
        loop {
            let Some(i) = self
                .waiters
                .iter()
                .position(|w| self.conflict(w.family, &w.req).is_none())
            else {
                return granted;
            };
            let w = self.waiters.remove(i);
            // Not `apply`: that would grant further waiters itself and their
            // callbacks would be lost (found as EIO replies when several shared
            // waiters were released at once). This loop grants them in turn.
            self.set_range(w.family, w.req, true);
            granted.push((w.done.into_inner(), Ok(())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(start: u64, end: u64, write: bool, owner: u64) -> RangeLock {
        RangeLock {
            start,
            end,
            write,
            owner,
            pid: owner as u32,
        }
    }

    #[test]
    fn split_and_merge() {
        let mut t = LockTable::default();
        t.apply(Family::Posix, l(0, 99, true, 1), true);
        t.apply(Family::Posix, l(40, 59, false, 1), false); // unlock the middle
        assert_eq!(t.posix.len(), 2);
        assert!(t.conflict(Family::Posix, &l(50, 50, true, 2)).is_none());
        assert!(t.conflict(Family::Posix, &l(10, 10, false, 2)).is_some());
        t.apply(Family::Posix, l(40, 59, true, 1), true);
        assert_eq!(t.posix, vec![l(0, 99, true, 1)]);
    }

    #[test]
    fn readers_share_writers_exclude() {
        let mut t = LockTable::default();
        t.apply(Family::Posix, l(0, 9, false, 1), true);
        assert!(t.conflict(Family::Posix, &l(0, 9, false, 2)).is_none());
        assert!(t.conflict(Family::Posix, &l(5, 5, true, 2)).is_some());
        // Families are independent.
        assert!(t.conflict(Family::Flock, &l(5, 5, true, 2)).is_none());
    }

    #[test]
    fn all_shared_waiters_are_granted_and_answered() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let mut t = LockTable::default();
        t.apply(Family::Posix, l(0, 9, true, 1), true);
        let answered = Arc::new(AtomicUsize::new(0));
        for owner in 2..6 {
            let a = answered.clone();
            t.park(
                Family::Posix,
                l(0, 9, false, owner),
                owner,
                Box::new(move |r| {
                    assert_eq!(r, Ok(()));
                    a.fetch_add(1, Ordering::SeqCst);
                }),
            );
        }
        let done = t.release_owner(Family::Posix, 1);
        assert_eq!(done.len(), 4, "every shared waiter is granted");
        for (cb, r) in done {
            cb(r);
        }
        assert_eq!(answered.load(Ordering::SeqCst), 4);
        assert!(t.waiters.is_empty());
    }

    #[test]
    fn waiter_granted_on_release() {
        use std::sync::{Arc, Mutex};
        let mut t = LockTable::default();
        t.apply(Family::Posix, l(0, 9, true, 1), true);
        let got = Arc::new(Mutex::new(None));
        let g = got.clone();
        t.park(
            Family::Posix,
            l(0, 0, true, 2),
            7,
            Box::new(move |r| *g.lock().unwrap() = Some(r)),
        );
        let done = t.release_owner(Family::Posix, 1);
        assert_eq!(done.len(), 1);
        for (cb, r) in done {
            cb(r);
        }
        assert_eq!(*got.lock().unwrap(), Some(Ok(())));
        assert!(t.conflict(Family::Posix, &l(0, 0, false, 3)).is_some());
    }
}
