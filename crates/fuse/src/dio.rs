//! Direct writes and the kernel's page cache (xfstests generic/451).
//!
//! With FUSE_ASYNC_DIO the kernel queues an asynchronous O_DIRECT write
//! (`-EIOCBQUEUED`), so `generic_file_direct_write` skips the page cache
//! invalidation it does after a synchronous one; it invalidates only before
//! sending the write. A buffered READ served between that invalidation and
//! the moment the engine applies the write leaves old pages in the cache,
//! and a buffered read after the write completed returns them.
//!
//! So a successful O_DIRECT WRITE of an inode whose pages the kernel may
//! cache is answered only after a FUSE_NOTIFY_INVAL_INODE of what it wrote.
//! Three rules keep that from deadlocking the kernel:
//! - The invalidation (`invalidate_inode_pages2_range`) waits for page locks
//!   held by buffered readers and write-through writers until their READ or
//!   WRITE is answered. It is therefore sent by a thread of its own, never by
//!   a worker or ring thread: those keep serving the requests that unlock the
//!   pages.
//! - Held replies are bounded ([`DirectWrites::new`]'s `max_held`): each
//!   holds one of the kernel's `max_background` slots (direct writes are
//!   background requests) and, with io_uring, one entry of its CPU's queue;
//!   a readahead READ that unlocks a page needs a slot and an entry too.
//!   Past the bound a direct write is answered at once and its invalidation
//!   still queued (unanswered), so the stale window stays as short as the
//!   queue.
//! - A watchdog answers a batch whose invalidation has not returned within
//!   [`STALL`]: the one known way for it to wait on its own reply is a
//!   direct write the kernel fell back to buffered (after its page cache
//!   invalidation failed with EBUSY), which still carries O_DIRECT and can
//!   hold a partial page locked while waiting for its WRITE's reply.
//!
//! Which inodes may have cached pages: every READ or WRITE without O_DIRECT
//! (buffered reads, readahead, mmap faults, write-through writes) bumps a
//! generation counter of the inode's slot before touching the engine. A
//! direct write is answered at once when its slot saw no buffered request
//! ever, or none since the inode's last whole-file invalidation: pure
//! O_DIRECT use pays nothing after its first two held writes. The per-inode
//! record exists only for inodes with held direct writes and goes when the
//! kernel forgets the inode (its pages go with it). Pages filled through a
//! mapping of a descriptor opened with O_DIRECT (the READ then carries
//! O_DIRECT too) are not seen; the kernel's own invalidation before each
//! direct write still covers whatever was cached before that write was sent.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fuser::{INodeNo, Notifier, ReplyWrite};
use parking_lot::{Condvar, Mutex};

/// How long a batch of invalidations may take before its writes are answered
/// anyway. Legitimate waits are for READs that workers serve in
/// milliseconds, even on a loaded machine.
pub(crate) const STALL: Duration = Duration::from_secs(2);

/// Queued invalidations at most, answered or not.
const MAX_QUEUED: usize = 64;

/// Generation counters, one per slot of inode numbers (modulo): a fixed
/// table, so that buffered I/O of any number of files costs no memory and
/// no lock. Two files sharing a slot only cost extra invalidations.
const SLOTS: usize = 16_384;

const SHARDS: usize = 64;

/// Per inode with held direct writes: the slot generation its last
/// whole-file invalidation began at (`clean`), and the one a range
/// invalidation was last planned at (`ranged`).
#[derive(Clone, Copy, Default)]
struct Entry {
    clean: u64,
    ranged: u64,
}

/// Which inodes' pages the kernel may cache.
struct Tracker {
    gens: Box<[AtomicU64]>,
    shards: Box<[Mutex<HashMap<u64, Entry>>]>,
}

enum Plan {
    /// No buffered request since the last whole-file invalidation.
    Nothing,
    Range,
    Whole,
}

impl Tracker {
    fn new() -> Tracker {
        Tracker {
            gens: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn slot(&self, ino: u64) -> &AtomicU64 {
        &self.gens[(ino % SLOTS as u64) as usize]
    }

    fn shard(&self, ino: u64) -> &Mutex<HashMap<u64, Entry>> {
        &self.shards[(ino % SHARDS as u64) as usize]
    }

    /// Before a buffered request touches the engine. A direct write that the
    /// engine applies after that request read its data loads the generation
    /// after applying, so it sees this increment (the engine's locks order
    /// the two); a request that reads after the write sees new data.
    fn note_cached(&self, ino: u64) {
        self.slot(ino).fetch_add(1, Ordering::SeqCst);
    }

    /// After a direct write was applied: the generation, when pages may be
    /// cached (`None`: nothing buffered since the last whole-file
    /// invalidation, or ever).
    fn cached(&self, ino: u64) -> Option<u64> {
        let seq = self.slot(ino).load(Ordering::SeqCst);
        if seq == 0 {
            return None;
        }
        let clean = self
            .shard(ino)
            .lock()
            .get(&ino)
            .is_some_and(|e| e.clean == seq);
        (!clean).then_some(seq)
    }

    /// A range invalidation first; a whole-file one when a second direct
    /// write finds no buffered request since the previous one, after which
    /// direct writes are answered at once again (pure direct I/O pays
    /// nothing).
    fn plan(&self, ino: u64, seq: u64) -> Plan {
        let mut map = self.shard(ino).lock();
        let e = map.entry(ino).or_default();
        if e.clean == seq {
            Plan::Nothing
        } else if e.ranged == seq && self.slot(ino).load(Ordering::SeqCst) == seq {
            Plan::Whole
        } else {
            e.ranged = seq;
            Plan::Range
        }
    }

    /// After a whole-file invalidation that began once `seq` was read:
    /// unless a buffered request started since, nothing is cached.
    fn cleaned(&self, ino: u64, seq: u64) {
        let mut map = self.shard(ino).lock();
        if self.slot(ino).load(Ordering::SeqCst) == seq {
            map.entry(ino).or_default().clean = seq;
        }
    }

    fn forget(&self, ino: u64) {
        self.shard(ino).lock().remove(&ino);
    }
}

struct Item {
    ino: u64,
    off: u64,
    /// Exclusive; `u64::MAX`: to the end of the file.
    end: u64,
    seq: u64,
    reply: Option<(ReplyWrite, u32)>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Item>,
    /// Replies held, queued or in the batch being invalidated.
    held: usize,
    /// The replies of the batch being invalidated.
    current: Vec<(ReplyWrite, u32)>,
    busy: bool,
    batch: u64,
    /// The watchdog gave up on the batch in progress: answer at once until
    /// it returns.
    stalled: bool,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    watch: Condvar,
    tracker: Arc<Tracker>,
    notifier: Arc<OnceLock<Notifier>>,
}

/// The adapter's side: tracking, and the invalidator started at first use.
pub(crate) struct DirectWrites {
    tracker: Arc<Tracker>,
    notifier: Arc<OnceLock<Notifier>>,
    max_held: usize,
    /// `None` inside: the threads could not be started; answer at once.
    shared: OnceLock<Option<Arc<Shared>>>,
}

impl DirectWrites {
    /// `max_held`: replies held at most (see the module comment).
    pub(crate) fn new(notifier: Arc<OnceLock<Notifier>>, max_held: usize) -> DirectWrites {
        DirectWrites {
            tracker: Arc::new(Tracker::new()),
            notifier,
            max_held,
            shared: OnceLock::new(),
        }
    }

    /// A READ or WRITE without O_DIRECT is about to be served: the kernel
    /// may cache the inode's pages. Called before the engine is touched.
    pub(crate) fn note_cached(&self, ino: u64) {
        self.tracker.note_cached(ino);
    }

    /// The kernel dropped the inode, and its pages with it.
    pub(crate) fn forget(&self, ino: u64) {
        self.tracker.forget(ino);
    }

    /// Answers an applied O_DIRECT write of `n` bytes at `off` (`None`: an
    /// append, position unknown): at once when the inode has no cached
    /// pages, else after invalidating what it wrote.
    pub(crate) fn written(&self, ino: u64, off: Option<u64>, n: u32, reply: ReplyWrite) {
        let Some(seq) = self.tracker.cached(ino) else {
            return reply.written(n);
        };
        let Some(sh) = self.shared() else {
            return reply.written(n);
        };
        let (off, end) = match off {
            Some(o) => (o, o.saturating_add(u64::from(n))),
            None => (0, u64::MAX),
        };
        let mut st = sh.state.lock();
        let mut item = Item {
            ino,
            off,
            end,
            seq,
            reply: None,
        };
        if st.closed || st.stalled || st.held >= self.max_held {
            // Safe fallback: never wait for room (the writes ahead may be
            // waiting for a READ this thread would serve next).
            if !st.closed && st.queue.len() < MAX_QUEUED {
                st.queue.push_back(item);
                sh.work.notify_one();
            }
            drop(st);
            tracing::debug!("direct write to inode {ino} answered before its invalidation");
            return reply.written(n);
        }
        tracing::trace!("direct write to inode {ino} waits for its invalidation");
        item.reply = Some((reply, n));
        st.held += 1;
        st.queue.push_back(item);
        sh.work.notify_one();
    }

    fn shared(&self) -> Option<&Arc<Shared>> {
        self.shared
            .get_or_init(|| {
                let sh = Arc::new(Shared {
                    state: Mutex::new(State::default()),
                    work: Condvar::new(),
                    watch: Condvar::new(),
                    tracker: self.tracker.clone(),
                    notifier: self.notifier.clone(),
                });
                let (a, b) = (sh.clone(), sh.clone());
                let started = std::thread::Builder::new()
                    .name("memfs-dio-inval".into())
                    .spawn(move || invalidator(&a))
                    .and_then(|_| {
                        std::thread::Builder::new()
                            .name("memfs-dio-watch".into())
                            .spawn(move || watchdog(&b))
                    });
                match started {
                    Ok(_) => Some(sh),
                    Err(e) => {
                        // Without the watchdog the invalidator could hold
                        // replies for ever: close it (it answers what it has).
                        close(&sh);
                        tracing::warn!(
                            "no thread for page cache invalidation after direct writes ({e}): \
                             buffered reads racing direct writes may see old data"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }
}

impl Drop for DirectWrites {
    fn drop(&mut self) {
        if let Some(Some(sh)) = self.shared.get() {
            close(sh);
        }
    }
}

fn close(sh: &Shared) {
    sh.state.lock().closed = true;
    sh.work.notify_all();
    sh.watch.notify_all();
}

fn invalidator(sh: &Shared) {
    loop {
        let mut st = sh.state.lock();
        while st.queue.is_empty() && !st.closed {
            sh.work.wait(&mut st);
        }
        let mut items: Vec<Item> = st.queue.drain(..).collect();
        if items.is_empty() {
            // Closed and drained.
            st.closed = true;
            sh.watch.notify_all();
            return;
        }
        let closed = st.closed;
        st.current = items.iter_mut().filter_map(|i| i.reply.take()).collect();
        st.busy = true;
        st.batch += 1;
        sh.watch.notify_all();
        drop(st);

        // Once the session is gone there is no kernel to tell.
        if !closed {
            invalidate(sh, &mut items);
        }

        let mut st = sh.state.lock();
        let replies = std::mem::take(&mut st.current);
        st.held -= replies.len();
        st.busy = false;
        st.stalled = false;
        sh.watch.notify_all();
        drop(st);
        for (r, n) in replies {
            r.written(n);
        }
    }
}

/// One notification per inode of the batch: the union of its ranges, or
/// the whole file.
fn invalidate(sh: &Shared, items: &mut [Item]) {
    let Some(n) = sh.notifier.get() else { return };
    items.sort_unstable_by_key(|i| i.ino);
    for group in items.chunk_by(|a, b| a.ino == b.ino) {
        let ino = group[0].ino;
        let seq = group.iter().map(|i| i.seq).max().unwrap_or(0);
        let off = group.iter().map(|i| i.off).min().unwrap_or(0);
        let end = group.iter().map(|i| i.end).max().unwrap_or(u64::MAX);
        let r = match sh.tracker.plan(ino, seq) {
            Plan::Nothing => continue,
            Plan::Whole => n.inval_inode(INodeNo(ino), 0, 0).map(|()| {
                sh.tracker.cleaned(ino, seq);
            }),
            Plan::Range => {
                // len 0: to the end of the file.
                let len = if end == u64::MAX { 0 } else { end - off };
                n.inval_inode(
                    INodeNo(ino),
                    i64::try_from(off).unwrap_or(i64::MAX),
                    i64::try_from(len).unwrap_or(0),
                )
            }
        };
        // ENOENT (the kernel dropped the inode) is taken as success by
        // fuser; other errors mean the connection is going away.
        if let Err(e) = r {
            tracing::debug!("invalidating the pages of inode {ino} after a direct write: {e}");
        }
    }
}

fn watchdog(sh: &Shared) {
    let mut st = sh.state.lock();
    loop {
        while !st.busy && !st.closed {
            sh.watch.wait(&mut st);
        }
        if !st.busy {
            return;
        }
        let batch = st.batch;
        let deadline = Instant::now() + STALL;
        while st.busy && st.batch == batch {
            if sh.watch.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
        if !(st.busy && st.batch == batch) {
            continue;
        }
        st.stalled = true;
        let mut replies = std::mem::take(&mut st.current);
        replies.extend(st.queue.iter_mut().filter_map(|i| i.reply.take()));
        st.held -= replies.len();
        tracing::warn!(
            "page cache invalidation after direct writes stalled for {STALL:?}: \
             answering {} writes before it",
            replies.len()
        );
        parking_lot::MutexGuard::unlocked(&mut st, || replies_sent(replies));
        // Wait for that batch to end before watching the next one.
        while st.busy && st.batch == batch && !st.closed {
            sh.watch.wait(&mut st);
        }
    }
}

fn replies_sent(replies: Vec<(ReplyWrite, u32)>) {
    for (r, n) in replies {
        r.written(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_a_range_then_the_whole_file_then_nothing() {
        let t = Tracker::new();
        assert!(t.cached(7).is_none(), "no buffered request yet");
        t.note_cached(7);
        let g = t.cached(7).unwrap();
        assert!(matches!(t.plan(7, g), Plan::Range));
        // No buffered request since: the next direct write clears the file.
        assert!(matches!(t.plan(7, g), Plan::Whole));
        t.cleaned(7, g);
        assert!(t.cached(7).is_none());
        assert!(matches!(t.plan(7, g), Plan::Nothing));
        // Forgotten by the kernel: cached again only after buffered I/O.
        t.forget(7);
        t.note_cached(7);
        assert!(t.cached(7).is_some());
    }

    #[test]
    fn a_buffered_request_during_an_invalidation_keeps_the_inode_cached() {
        let t = Tracker::new();
        t.note_cached(3);
        let g = t.cached(3).unwrap();
        assert!(matches!(t.plan(3, g), Plan::Range));
        assert!(matches!(t.plan(3, g), Plan::Whole));
        t.note_cached(3);
        t.cleaned(3, g);
        let g2 = t.cached(3).expect("a reader came in: still cached");
        assert!(g2 > g);
        assert!(matches!(t.plan(3, g2), Plan::Range));
    }

    #[test]
    fn files_sharing_a_slot_only_cost_invalidations() {
        let t = Tracker::new();
        let (a, b) = (5, 5 + SLOTS as u64);
        t.note_cached(a);
        // b was never read buffered, but shares a's counter: conservative.
        assert!(t.cached(b).is_some());
        let g = t.cached(b).unwrap();
        assert!(matches!(t.plan(b, g), Plan::Range));
        assert!(matches!(t.plan(b, g), Plan::Whole));
        t.cleaned(b, g);
        assert!(t.cached(b).is_none());
        // a is still cached as far as its own writes know.
        assert!(t.cached(a).is_some());
    }
}
