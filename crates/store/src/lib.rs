//! memfs-store
