//! Bearer tokens with two scopes, compared in constant time.

use std::fmt;
use taskstage::ErrorCode;

use axum::http::{header, HeaderMap, Method};

use super::error::ApiError;
use axum::http::StatusCode;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Scope {
    /// Read: list, show, stream, health.
    Read,
    /// Read and command: pause, resume, stop, create.
    Admin,
}

impl Scope {
    /// `"read"` or `"admin"`.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }
}

/// Who may call the API: nobody needs a token ([`Auth::open`]), or every call under
/// `/v1/` (except `GET /v1/health`) carries `Authorization: Bearer <token>` with a
/// token of the scope it needs ([`Auth::tokens`]).
///
/// Tokens are compared in constant time (the time does not depend on where a guess
/// first differs), and never printed: the `Debug` form shows only how many there are.
#[derive(Clone, Default)]
pub struct Auth {
    tokens: Vec<(Vec<u8>, Scope)>,
    open: bool,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("open", &self.open)
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl Auth {
    /// No token needed: every caller is admin. For a listener on loopback only (the
    /// `taskstage serve` command refuses anything else without a token).
    pub fn open() -> Self {
        Auth {
            tokens: Vec::new(),
            open: true,
        }
    }

    /// Tokens needed; add them with [`Auth::read_only`] and [`Auth::admin`]. With
    /// none added, every call under `/v1/` but health is refused (401).
    pub fn tokens() -> Self {
        Auth::default()
    }

    /// Adds a token that may read. An empty token is ignored (it would match an
    /// empty header).
    pub fn read_only(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        if !token.is_empty() {
            self.tokens.push((token.into_bytes(), Scope::Read));
        }
        self
    }

    /// Adds a token that may read and command. An empty token is ignored.
    pub fn admin(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        if !token.is_empty() {
            self.tokens.push((token.into_bytes(), Scope::Admin));
        }
        self
    }

    /// Whether calls need no token.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The scope of the bearer token in `headers`: 401 without a known token.
    pub(crate) fn scope_of(&self, headers: &HeaderMap) -> Result<Scope, ApiError> {
        if self.open {
            return Ok(Scope::Admin);
        }
        let unauthorized = |msg: &str| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                msg.to_owned(),
            )
        };
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("no bearer token: send Authorization: Bearer <token>"))?;
        let given = bearer_token(value.as_bytes())
            .ok_or_else(|| unauthorized("the Authorization header is not a bearer token"))?;
        // Every token is compared, whatever matched before: the time depends on the
        // number and lengths of the tokens, not on the guess.
        let mut found: Option<Scope> = None;
        for (token, scope) in &self.tokens {
            if constant_time_eq(token, given) {
                found = Some(found.map_or(*scope, |s| s.max(*scope)));
            }
        }
        found.ok_or_else(|| unauthorized("the bearer token is not known"))
    }

    /// Checks that `headers` carry a token for `method` (GET and HEAD read; every
    /// other method commands).
    pub(crate) fn check(&self, headers: &HeaderMap, method: &Method) -> Result<Scope, ApiError> {
        let scope = self.scope_of(headers)?;
        let needs = if method == Method::GET || method == Method::HEAD {
            Scope::Read
        } else {
            Scope::Admin
        };
        if scope < needs {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::Forbidden,
                format!(
                    "a {} token may not {method}: it needs an admin token",
                    scope.name()
                ),
            ));
        }
        Ok(scope)
    }
}

/// Whether `a == b`, in a time that depends on the lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        // Past the end of `b`, compare with 0: the loop runs a.len() times always.
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

/// The token of an `Authorization` value of the Bearer scheme. The scheme is
/// matched without regard to case (RFC 9110, section 11.1); one or more spaces
/// part it from the token.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    scheme
        .eq_ignore_ascii_case(b"Bearer")
        .then(|| rest.trim_ascii_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_every_byte_and_the_length_agree() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secret", b""));
    }

    #[test]
    fn debug_never_shows_a_token() {
        let auth = Auth::tokens().admin("s3cr3t-admin").read_only("r3ad");
        let text = format!("{auth:?}");
        assert!(!text.contains("s3cr3t") && !text.contains("r3ad"), "{text}");
    }
}
