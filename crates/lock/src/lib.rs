//! memfs-lock
