//! memfs-journal
