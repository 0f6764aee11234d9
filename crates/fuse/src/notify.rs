//! The kernel's caches are told what changed from one thread that holds
//! nothing of memfs: no served tree, no lock, no gate, no request.
//!
//! A FUSE notification is a write to `/dev/fuse` that the kernel carries
//! out in the writer's context, and some take kernel locks:
//! FUSE_NOTIFY_INVAL_ENTRY takes the parent directory's `i_rwsem`,
//! FUSE_NOTIFY_INVAL_INODE with a page range takes the pages' locks. The
//! processes holding those locks may be waiting for a request memfs is
//! serving (an `open(O_CREAT)` holds the directory while its CREATE is
//! answered). So a notification must never be written by a thread that
//! such a request waits for, or the two wait for each other: the wedge of
//! issue 35 was a rollback's INVAL_ENTRY behind a CREATE whose worker was
//! stuck behind the rollback.
//!
//! Here the writer is `memfs-notify`, which only ever waits for the kernel,
//! and the kernel only for requests in flight, which never wait for it.
//! The thread asking (the control thread of a rollback or a snapshot
//! command) waits for its batch with a bound, [`WAIT`]: should the kernel
//! not take it by then, the command returns, saying so in the log, rather
//! than keeping the control socket (and every later command) waiting.
//! docs/fuse.md, "Notifications", lists every place memfs notifies and
//! why each is safe.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fuser::{INodeNo, Notifier};

/// From this many invalidations on, a batch is sent from several threads:
/// each notification is a synchronous write to /dev/fuse, independent of
/// the others.
const PARALLEL: usize = 4096;

/// How long an asker waits for its batch. Invalidating the 100,000 nodes
/// of a big rollback takes the kernel about a second on a 2-vCPU VM; a
/// minute without the kernel taking a batch is a stuck kernel lock.
pub(crate) const WAIT: Duration = Duration::from_secs(60);

/// One thing for the kernel to forget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Inval {
    /// Node `ino`'s attributes, and its pages from `off` for `len` bytes
    /// (`off` -1: the attributes only; `len` 0: to the end of the file).
    Inode { ino: u64, off: i64, len: i64 },
    /// The name `name` in directory `parent`.
    Entry { parent: u64, name: Vec<u8> },
    /// Every name: each is looked up again at its next use.
    Epoch,
}

/// What a batch took, once the kernel has taken it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    /// From the post to the last notification's return.
    pub took: Duration,
}

struct Batch {
    items: Vec<Inval>,
    posted: Instant,
    done: mpsc::SyncSender<Sent>,
}

/// The sending thread's mailbox. Cloned by every [`crate::swap::Swapper`];
/// the thread ends when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Notifications {
    tx: mpsc::Sender<Batch>,
}

impl Notifications {
    /// Starts the sending thread over `notifier`.
    pub(crate) fn start(notifier: Notifier) -> std::io::Result<Notifications> {
        let (tx, rx) = mpsc::channel::<Batch>();
        std::thread::Builder::new()
            .name("memfs-notify".into())
            // Ends when every sender is gone (the mount's swapper dropped).
            .spawn(move || {
                for b in rx {
                    send(&notifier, &b.items);
                    // The asker may have stopped waiting: nobody to tell.
                    let _ = b.done.try_send(Sent {
                        took: b.posted.elapsed(),
                    });
                }
            })?;
        Ok(Notifications { tx })
    }

    /// Has the kernel forget `item` without waiting: for a shared tree's
    /// threads, which must never wait for the kernel (the kernel may be
    /// waiting for a request that waits for them).
    pub(crate) fn post(&self, item: Inval) {
        // Nobody listens for the answer: a receiver dropped at once.
        let (done, _) = mpsc::sync_channel(1);
        let _ = self.tx.send(Batch {
            items: vec![item],
            posted: Instant::now(),
            done,
        });
    }

    /// Has the kernel forget `items` and waits until it has, at most
    /// [`WAIT`]; `what` names the batch in the log if it does not.
    /// Call it holding nothing a FUSE request may wait for (the module
    /// comment says why).
    pub(crate) fn send_and_wait(&self, what: &str, items: Vec<Inval>) -> Option<Sent> {
        if items.is_empty() {
            return Some(Sent {
                took: Duration::ZERO,
            });
        }
        let n = items.len();
        let (done, rx) = mpsc::sync_channel(1);
        let posted = Instant::now();
        if self
            .tx
            .send(Batch {
                items,
                posted,
                done,
            })
            .is_err()
        {
            // The thread is gone only when the session is: no kernel to tell.
            return None;
        }
        match rx.recv_timeout(WAIT) {
            Ok(s) => Some(s),
            Err(_) => {
                tracing::warn!(
                    "{what}: the kernel has not taken {n} cache invalidations in {WAIT:?}; \
                     going on without them (they are still queued: a process holding a \
                     directory or page lock of this mount is not letting go)"
                );
                None
            }
        }
    }
}

fn send(notifier: &Notifier, items: &[Inval]) {
    let one = |part: &[Inval]| {
        for i in part {
            // ENOENT (the kernel let the node go, or never had the name):
            // nothing to forget. Other errors: the connection is going away.
            let r = match i {
                Inval::Inode { ino, off, len } => notifier.inval_inode(INodeNo(*ino), *off, *len),
                Inval::Entry { parent, name } => {
                    notifier.inval_entry(INodeNo(*parent), OsStr::from_bytes(name))
                }
                Inval::Epoch => notifier.inc_epoch(),
            };
            match r {
                Ok(()) => {}
                // Not a node the kernel let go: the kernel refused it, and
                // the names it holds stay until their timeout.
                Err(e) if *i == Inval::Epoch => {
                    tracing::warn!("the kernel refused FUSE_NOTIFY_INC_EPOCH: {e}")
                }
                Err(e) => tracing::trace!("invalidation {i:?}: {e}"),
            }
        }
    };
    if items.len() < PARALLEL {
        return one(items);
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    // Scoped: joined before the batch is reported done; they too hold
    // nothing but their part of the batch.
    std::thread::scope(|s| {
        for part in items.chunks(items.len().div_ceil(threads)) {
            s.spawn(move || one(part));
        }
    });
}
