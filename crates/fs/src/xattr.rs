//! Extended attributes of one inode: few per node, so a small vector beats a map.

use crate::acl::{ACL_ACCESS, ACL_DEFAULT};
use crate::types::{XATTR_LIST_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX, XattrMode};
use crate::{Errno, Result};

/// A name and its value.
type Entry = (Box<[u8]>, Box<[u8]>);

#[derive(Clone, Default)]
pub(crate) struct Xattrs {
    entries: Vec<Entry>,
}

/// Checks a name the way Linux's VFS does before a file system sees it.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Errno::ERANGE);
    }
    // Of the system namespace, only the POSIX ACLs exist here (as on tmpfs).
    if name == ACL_ACCESS || name == ACL_DEFAULT {
        return Ok(());
    }
    let known = [&b"user."[..], b"trusted.", b"security."];
    if !known
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
    {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

impl Xattrs {
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| &**v)
    }

    pub fn set(&mut self, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG);
        }
        match (self.entries.iter_mut().find(|(n, _)| &**n == name), mode) {
            (Some(_), XattrMode::Create) => Err(Errno::EEXIST),
            (None, XattrMode::Replace) => Err(Errno::ENODATA),
            (Some((_, v)), _) => {
                *v = value.into();
                Ok(())
            }
            (None, _) => {
                if self.list_len() + name.len() + 1 > XATTR_LIST_MAX {
                    return Err(Errno::ENOSPC);
                }
                self.entries.push((name.into(), value.into()));
                Ok(())
            }
        }
    }

    pub fn remove(&mut self, name: &[u8]) -> Result<()> {
        let i = self
            .entries
            .iter()
            .position(|(n, _)| &**n == name)
            .ok_or(Errno::ENODATA)?;
        self.entries.swap_remove(i);
        Ok(())
    }

    fn list_len(&self) -> usize {
        self.entries.iter().map(|(n, _)| n.len() + 1).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.entries.iter().map(|(n, v)| (&**n, &**v))
    }

    /// Names, each followed by a NUL byte, as `listxattr` returns them.
    pub fn list(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.list_len());
        for (n, _) in &self.entries {
            out.extend_from_slice(n);
            out.push(0);
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
