//! POSIX ACLs in the kernel's xattr format (`posix_acl_xattr`, version 2),
//! and the rules Linux applies to them (fs/posix_acl.c): validation, the
//! mode an ACL implies, `chmod` rewriting an ACL, inheritance at creation,
//! and the permission check.
//!
//! The engine stores an ACL as the value of its xattr
//! (`system.posix_acl_access` or `system.posix_acl_default`), in canonical
//! form (entries as given, ids of the unnamed entries undefined). An access
//! ACL that says no more than the mode is not stored at all, as on tmpfs.

use crate::types::Ctx;
use crate::{Errno, Result};

/// The xattr of the ACL that decides access to the node itself.
pub const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// The xattr of a directory's ACL that new nodes inherit.
pub const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;
const UNDEFINED_ID: u32 = u32::MAX;

const TAG_USER_OBJ: u16 = 0x01;
const TAG_USER: u16 = 0x02;
const TAG_GROUP_OBJ: u16 = 0x04;
const TAG_GROUP: u16 = 0x08;
const TAG_MASK: u16 = 0x10;
const TAG_OTHER: u16 = 0x20;

/// Whom an entry is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// The owner.
    UserObj,
    /// A named user.
    User(u32),
    /// The owning group.
    GroupObj,
    /// A named group.
    Group(u32),
    /// The most the group class (named users, groups, owning group) gets.
    Mask,
    /// Everybody else.
    Other,
}

/// One entry: a tag and its permissions (`rwx` as 4, 2, 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: Tag,
    pub perm: u16,
}

/// An ACL: its entries in the order the kernel requires (owner, named
/// users, owning group, named groups, mask, other).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    pub entries: Vec<AclEntry>,
}

impl Acl {
    /// The three-entry ACL that says what `perm`'s rwx bits say.
    pub fn from_mode(perm: u16) -> Acl {
        let e = |tag, shift: u16| AclEntry {
            tag,
            perm: (perm >> shift) & 7,
        };
        Acl {
            entries: vec![e(Tag::UserObj, 6), e(Tag::GroupObj, 3), e(Tag::Other, 0)],
        }
    }

    /// Parses an xattr value as `posix_acl_from_xattr` does: `None` for an
    /// ACL of no entries (which the kernel treats as removal), EOPNOTSUPP
    /// for another version, EINVAL for anything malformed. It does not
    /// check the entries' order: see [`Acl::validate`].
    pub fn parse(value: &[u8]) -> Result<Option<Acl>> {
        if value.len() < HEADER {
            return Err(Errno::EINVAL);
        }
        if u32::from_le_bytes(value[..HEADER].try_into().expect("4 bytes")) != VERSION {
            return Err(Errno::EOPNOTSUPP);
        }
        let body = &value[HEADER..];
        if !body.len().is_multiple_of(ENTRY) {
            return Err(Errno::EINVAL);
        }
        if body.is_empty() {
            return Ok(None);
        }
        let mut entries = Vec::with_capacity(body.len() / ENTRY);
        for e in body.chunks_exact(ENTRY) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let tag = match tag {
                TAG_USER_OBJ => Tag::UserObj,
                TAG_USER if id != UNDEFINED_ID => Tag::User(id),
                TAG_GROUP_OBJ => Tag::GroupObj,
                TAG_GROUP if id != UNDEFINED_ID => Tag::Group(id),
                TAG_MASK => Tag::Mask,
                TAG_OTHER => Tag::Other,
                _ => return Err(Errno::EINVAL),
            };
            entries.push(AclEntry { tag, perm });
        }
        Ok(Some(Acl { entries }))
    }

    /// Parses and validates: what a value must pass to be stored.
    pub fn parse_valid(value: &[u8]) -> Result<Option<Acl>> {
        let acl = Acl::parse(value)?;
        if let Some(a) = &acl {
            a.validate()?;
        }
        Ok(acl)
    }

    /// The xattr value (`posix_acl_to_xattr`).
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + ENTRY * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            let (tag, id) = match e.tag {
                Tag::UserObj => (TAG_USER_OBJ, UNDEFINED_ID),
                Tag::User(id) => (TAG_USER, id),
                Tag::GroupObj => (TAG_GROUP_OBJ, UNDEFINED_ID),
                Tag::Group(id) => (TAG_GROUP, id),
                Tag::Mask => (TAG_MASK, UNDEFINED_ID),
                Tag::Other => (TAG_OTHER, UNDEFINED_ID),
            };
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// `posix_acl_valid`: permissions within rwx; exactly one owner, owning
    /// group and other entry, in the canonical order; a mask, after the
    /// groups, exactly when there are named entries.
    pub fn validate(&self) -> Result<()> {
        #[derive(PartialEq)]
        enum State {
            Start,
            Users,
            Groups,
            Other,
            Done,
        }
        let mut state = State::Start;
        let mut needs_mask = false;
        for e in &self.entries {
            if e.perm & !7 != 0 {
                return Err(Errno::EINVAL);
            }
            state = match (e.tag, state) {
                (Tag::UserObj, State::Start) => State::Users,
                (Tag::User(_), State::Users) => {
                    needs_mask = true;
                    State::Users
                }
                (Tag::GroupObj, State::Users) => State::Groups,
                (Tag::Group(_), State::Groups) => {
                    needs_mask = true;
                    State::Groups
                }
                (Tag::Mask, State::Groups) => State::Other,
                (Tag::Other, State::Other) => State::Done,
                (Tag::Other, State::Groups) if !needs_mask => State::Done,
                _ => return Err(Errno::EINVAL),
            };
        }
        if state == State::Done {
            Ok(())
        } else {
            Err(Errno::EINVAL)
        }
    }

    /// `posix_acl_equiv_mode`: the rwx bits the ACL implies for the mode
    /// (the group bits are the mask's when there is one), and whether the
    /// mode alone says the same (no named entries, no mask).
    pub fn equiv_mode(&self) -> (u16, bool) {
        let mut mode = 0;
        let mut equiv = true;
        for e in &self.entries {
            match e.tag {
                Tag::UserObj => mode |= (e.perm & 7) << 6,
                Tag::GroupObj => mode |= (e.perm & 7) << 3,
                Tag::Other => mode |= e.perm & 7,
                Tag::Mask => {
                    mode = (mode & !0o070) | ((e.perm & 7) << 3);
                    equiv = false;
                }
                Tag::User(_) | Tag::Group(_) => equiv = false,
            }
        }
        (mode, equiv)
    }

    /// `__posix_acl_chmod`: a new mode's rwx bits rewrite the owner, other
    /// and mask entries (the owning group's when there is no mask).
    pub fn chmod(&mut self, perm: u16) {
        let has_mask = self.entries.iter().any(|e| e.tag == Tag::Mask);
        for e in &mut self.entries {
            match e.tag {
                Tag::UserObj => e.perm = (perm >> 6) & 7,
                Tag::Other => e.perm = perm & 7,
                Tag::Mask => e.perm = (perm >> 3) & 7,
                Tag::GroupObj if !has_mask => e.perm = (perm >> 3) & 7,
                _ => {}
            }
        }
    }

    /// `posix_acl_create_masq`: turns a parent's default ACL into a new
    /// node's access ACL given the mode the creator asked for. Both are
    /// narrowed to what the other allows; returns whether the ACL says more
    /// than the mode (and so must be stored).
    pub fn create_masq(&mut self, perm: &mut u16) -> bool {
        let mut mode = *perm & 0o777;
        let mut equiv = true;
        let mut group_obj = None;
        let mut mask = None;
        for (i, e) in self.entries.iter_mut().enumerate() {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= (mode >> 6) & 7;
                    mode &= (e.perm << 6) | !0o700;
                }
                Tag::User(_) | Tag::Group(_) => equiv = false,
                Tag::GroupObj => group_obj = Some(i),
                Tag::Other => {
                    e.perm &= mode & 7;
                    mode &= e.perm | !0o007;
                }
                Tag::Mask => {
                    mask = Some(i);
                    equiv = false;
                }
            }
        }
        // A valid ACL has an owning group entry, so one of the two exists.
        if let Some(i) = mask.or(group_obj) {
            let e = &mut self.entries[i];
            e.perm &= (mode >> 3) & 7;
            mode &= (e.perm << 3) | !0o070;
        }
        *perm = (*perm & !0o777) | mode;
        !equiv
    }

    /// `posix_acl_permission`: whether `ctx` may do `want` (rwx bits) on a
    /// node owned by `uid`/`gid` with this access ACL. The caller's groups
    /// are its primary group plus whatever `in_group` says.
    pub fn permits(
        &self,
        ctx: Ctx,
        uid: u32,
        gid: u32,
        in_group: &dyn Fn(u32) -> bool,
        want: u16,
    ) -> bool {
        let member = |g: u32| ctx.gid == g || in_group(g);
        let mask = self
            .entries
            .iter()
            .find(|e| e.tag == Tag::Mask)
            .map_or(7, |e| e.perm);
        let mut found = false;
        for e in &self.entries {
            match e.tag {
                Tag::UserObj if ctx.uid == uid => return e.perm & want == want,
                Tag::User(u) if ctx.uid == u => return e.perm & mask & want == want,
                Tag::GroupObj if member(gid) => {
                    found = true;
                    if e.perm & want == want {
                        return e.perm & mask & want == want;
                    }
                }
                Tag::Group(g) if member(g) => {
                    found = true;
                    if e.perm & want == want {
                        return e.perm & mask & want == want;
                    }
                }
                Tag::Other => return !found && e.perm & want == want,
                _ => {}
            }
        }
        false
    }
}
