//! memfs-fs
