//! memfs-fuse
