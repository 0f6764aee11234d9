//! Credentials: `USER:TOKEN:ROLE` lines, ROLE one of read, write, follow.

use super::protocol::{ErrorCode, Role};
use ring::digest::{SHA256, digest};
use subtle::ConstantTimeEq;

struct Credential {
    user: String,
    /// SHA-256 of the token: comparing fixed-length digests in constant time
    /// leaks neither the token's bytes nor its length.
    token_hash: [u8; 32],
    role: Role,
}

/// The credentials a server accepts.
pub struct Auth {
    creds: Vec<Credential>,
}

impl std::fmt::Debug for Auth {
    // Never print tokens (or their digests).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field(
                "users",
                &self
                    .creds
                    .iter()
                    .map(|c| (&c.user, c.role))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn hash(token: &[u8]) -> [u8; 32] {
    let d = digest(&SHA256, token);
    let mut h = [0u8; 32];
    h.copy_from_slice(d.as_ref());
    h
}

impl Auth {
    /// Parses credential lines (blank lines and `#` comments are skipped).
    /// Entries may also be separated by commas, for `--auth u:t:read,v:w:write`.
    pub fn parse(text: &str) -> Result<Auth, String> {
        let mut creds = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            for entry in line.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let mut parts = entry.splitn(3, ':');
                let (Some(user), Some(token), Some(role)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    return Err(format!("line {}: expected USER:TOKEN:ROLE", i + 1));
                };
                if user.is_empty() || token.is_empty() {
                    return Err(format!("line {}: empty user or token", i + 1));
                }
                if user.len() > 255 || token.len() > 255 {
                    return Err(format!(
                        "line {}: user and token are at most 255 bytes",
                        i + 1
                    ));
                }
                let role = role
                    .trim()
                    .parse::<Role>()
                    .map_err(|e| format!("line {}: {e}", i + 1))?;
                creds.push(Credential {
                    user: user.to_string(),
                    token_hash: hash(token.as_bytes()),
                    role,
                });
            }
        }
        if creds.is_empty() {
            return Err("no credentials".into());
        }
        Ok(Auth { creds })
    }

    /// Checks a HELLO's credentials for the role it asks. Every credential
    /// is compared (no early exit), so the time does not tell which matched.
    pub fn check(&self, user: &[u8], token: &[u8], asked: Role) -> Result<(), (ErrorCode, String)> {
        let th = hash(token);
        let mut found: Option<Role> = None;
        for c in &self.creds {
            let ok = c.user.as_bytes().ct_eq(user) & c.token_hash.ct_eq(&th);
            if bool::from(ok) && found.is_none_or(|r| !r.grants(asked)) {
                found = Some(c.role);
            }
        }
        let name = String::from_utf8_lossy(user);
        match found {
            None => Err((
                ErrorCode::AuthFailed,
                format!("authentication failed for user {name:?}"),
            )),
            Some(r) if !r.grants(asked) => Err((
                ErrorCode::Forbidden,
                format!("user {name:?} has role {r}, which does not allow a {asked} session"),
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_tokens() {
        let a = Auth::parse("# c\nr:tok1:read\nw:tok2:write\n\nf:tok3:follow").unwrap();
        assert!(a.check(b"r", b"tok1", Role::Read).is_ok());
        assert_eq!(
            a.check(b"r", b"tok1", Role::Write).unwrap_err().0,
            ErrorCode::Forbidden
        );
        assert_eq!(
            a.check(b"r", b"tok2", Role::Read).unwrap_err().0,
            ErrorCode::AuthFailed
        );
        assert!(a.check(b"w", b"tok2", Role::Read).is_ok());
        assert!(a.check(b"w", b"tok2", Role::Write).is_ok());
        assert_eq!(
            a.check(b"w", b"tok2", Role::Follow).unwrap_err().0,
            ErrorCode::Forbidden
        );
        assert!(a.check(b"f", b"tok3", Role::Follow).is_ok());
        assert!(a.check(b"f", b"tok3", Role::Read).is_ok());
        assert!(
            Auth::parse("a:b:admin")
                .unwrap_err()
                .contains("unknown role")
        );
        assert!(Auth::parse("a:b").unwrap_err().contains("line 1"));
        assert!(Auth::parse("u:t:read, v:x:write").is_ok());
    }
}
