//! The crate's error type: every failure names what it concerns.

use std::path::{Path, PathBuf};

/// Errors of a durable file system; each names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Journal(#[from] memfs_journal::Error),
    #[error("checkpoint {file} is damaged: {reason}")]
    Image { file: PathBuf, reason: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn image_err(file: &Path, reason: impl Into<String>) -> Error {
    Error::Image {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}
