//! The recorder the engine calls for every mutation: a journal append, and
//! the settle protocol that waits for it (docs/durability.md, "Settling").

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use memfs_fs::{Errno, Mutation, Recorder};
use memfs_journal::{Durability, Journal, Token};

use crate::shared::Shared;

thread_local! {
    /// The last commit this thread recorded and has not waited for yet,
    /// with the journal that appended it: the engine's recorder interface
    /// passes no value from `record` to `settle`, and the two may reach
    /// different file systems when an online rollback swaps the tree
    /// between them (docs/durability.md, "Settling").
    static PENDING: Cell<Option<Token>> = const { Cell::new(None) };
    /// Journal space this thread reserved for the operation it is running
    /// (with the id of the journal it belongs to), not yet used by a commit.
    static RESERVED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// The recorder the engine calls: a journal append per mutation.
pub(crate) struct JournalRecorder {
    pub(crate) shared: Arc<Shared>,
}

impl JournalRecorder {
    /// Appends one commit: `encode` fills the record buffer (this thread's,
    /// reused) and appends it with whatever follows it to the journal,
    /// using the bytes `admit` reserved.
    fn append(
        &self,
        encode: impl FnOnce(&mut Vec<u8>, &Journal, u64) -> memfs_journal::Result<Token>,
    ) -> std::result::Result<u64, Errno> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Errno(libc::EROFS));
        }

        let key = self.shared.journal.id().get();
        let reserved = RESERVED.with(|r| {
            let (k, n) = r.get();
            if k == key {
                r.set((0, 0));
                n
            } else {
                0
            }
        });
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let r = BUF.with(|b| {
            let mut buf = b.borrow_mut();
            buf.clear();
            encode(&mut buf, &self.shared.journal, reserved)
        });
        let token = r.map_err(|e| self.fail("append", e))?;
        // An operation that records several commits settles the last,
        // which covers the earlier ones only if ids grow within a journal.
        let earlier = PENDING.with(|p| p.replace(Some(token)));
        debug_assert!(
            earlier.is_none_or(|e| e.journal() != token.journal() || e.commit() < token.commit()),
            "{earlier:?} then {token:?}"
        );
        Ok(token.commit())
    }

    fn fail(&self, what: &str, e: memfs_journal::Error) -> Errno {
        self.shared.mark_failed(what, &e);
        Errno::EIO
    }

    /// Gives back what this thread reserved and no commit used.
    fn release_reserved(&self) {
        let key = self.shared.journal.id().get();
        let (k, n) = RESERVED.with(|r| r.replace((0, 0)));
        if n > 0 && k == key {
            self.shared.journal.release(n);
        }
    }
}

impl Recorder for JournalRecorder {
    fn admit(&self, bytes: u64) -> std::result::Result<(), Errno> {
        if self.shared.closed.load(Ordering::Acquire) || self.shared.failed.load(Ordering::Acquire)
        {
            return Err(Errno(libc::EROFS));
        }
        // A reservation left by an earlier operation of this thread that
        // failed before committing.
        self.release_reserved();
        match self.shared.journal.reserve(bytes) {
            Ok(n) => {
                RESERVED.with(|r| r.set((self.shared.journal.id().get(), n)));
                Ok(())
            }
            Err(memfs_journal::Error::NoSpace { source, .. }) => {
                tracing::debug!("journal reservation refused: {source}");
                Err(Errno::ENOSPC)
            }
            Err(e) => Err(self.fail("space reservation", e)),
        }
    }

    fn record(&self, m: &Mutation<'_>) -> std::result::Result<u64, Errno> {
        self.append(
            |buf, journal, reserved| match crate::codec::encode(m, buf) {
                Some(data) => journal.append_reserved(&[&buf[..], data], reserved),
                None => journal.append_reserved(&[&buf[..]], reserved),
            },
        )
    }

    fn record_write(
        &self,
        attr: &memfs_fs::Attr,
        offset: u64,
        parts: &[&[u8]],
    ) -> std::result::Result<u64, Errno> {
        let len = parts.iter().map(|p| p.len()).sum();
        self.append(|buf, journal, reserved| {
            crate::codec::encode_write_head(attr, offset, len, buf);
            // The same commit as `record` of the bytes in one slice: the
            // journal appends the parts as they are.
            let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
            all.push(&buf[..]);
            all.extend_from_slice(parts);
            journal.append_reserved(&all, reserved)
        })
    }

    fn settle(&self) -> std::result::Result<(), Errno> {
        self.release_reserved();
        let Some(token) = PENDING.with(|p| p.take()) else {
            return Ok(());
        };
        if token.journal() != self.shared.journal.id() {
            // Recorded in a journal an online rollback has replaced since:
            // the rollback synced that journal before it swapped, so the
            // commit is durable there, and then either kept (at or before
            // the target) or undone with everything after the target, as
            // any write just before a rollback. Nothing is left to wait
            // for; the operation succeeded as it ran.
            tracing::debug!(
                commit = token.commit(),
                "settled a commit of a journal that was rolled back and replaced"
            );
            return Ok(());
        }
        self.shared
            .journal
            .complete(token)
            .map_err(|e| self.fail("write", e))
    }

    fn sync(&self) -> std::result::Result<(), Errno> {
        PENDING.with(|p| p.set(None));
        if self.shared.opts.durability == Durability::None {
            return Ok(());
        }
        self.shared
            .journal
            .sync()
            .map(|_| ())
            .map_err(|e| self.fail("sync", e))
    }
}
