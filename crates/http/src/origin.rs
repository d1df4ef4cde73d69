//! What a browser on the operator's machine may do: the checks that keep a page of
//! another origin from commanding the API or, through a rebound DNS name, reading it.
//!
//! A browser sends a cross-origin `POST` without asking first when it has no body or
//! a form's body, and it attaches nothing the page did not set; so a bearer token
//! already keeps a foreign page out, and these checks are what keeps it out of an
//! API without one ([`Auth::open`](super::Auth::open)), and a second wall with one:
//!
//! 1. Every request other than `GET`, `HEAD` and `OPTIONS` that carries an `Origin`
//!    must come from the origin it is sent to (its authority is the `Host` header),
//!    or from one allowed with [`Api::allow_origin`](super::Api::allow_origin); one
//!    marked `Sec-Fetch-Site: cross-site` is refused even without `Origin`. Clients
//!    that are not browsers (curl, the CLI, a script) send neither and pass.
//! 2. With no token needed, the `Host` header must name a loopback host
//!    (`localhost`, `*.localhost`, `127.0.0.0/8`, `[::1]`) or an allowed origin's:
//!    a page whose own name was rebound to 127.0.0.1 sends its own name, and gets
//!    403 for every route, reads included.
//!
//! The JSON-only rule for bodies (`POST /v1/tasks` needs `Content-Type:
//! application/json`, which no form can send) is in the route itself.

use axum::http::{header, HeaderMap, Method, StatusCode};
use taskstage::ErrorCode;

use super::error::ApiError;

/// The origins, besides the served one, allowed to send commands (and, with no
/// token, to name the server in `Host`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Browsers {
    /// Lowercase, without a trailing slash: `https://ops.example.com`.
    origins: Vec<String>,
}

impl Browsers {
    pub(crate) fn allow(&mut self, origin: &str) {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        if !origin.is_empty() && !self.origins.contains(&origin) {
            self.origins.push(origin);
        }
    }

    /// Checks one request's head; see the module docs.
    pub(crate) fn check(
        &self,
        headers: &HeaderMap,
        method: &Method,
        open: bool,
    ) -> Result<(), ApiError> {
        let host = text(headers, header::HOST.as_str()).map(str::to_ascii_lowercase);
        if open {
            if let Some(host) = &host {
                if !is_loopback_host(host) && !self.allows_host(host) {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        ErrorCode::ForbiddenHost,
                        format!(
                            "this server needs no token, so it answers only to a loopback host name, not {host:?}: open it as 127.0.0.1 or localhost, or allow the origin"
                        ),
                    ));
                }
            }
        }
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return Ok(());
        }
        let cross = |why: String| ApiError::new(StatusCode::FORBIDDEN, ErrorCode::CrossOrigin, why);
        match text(headers, header::ORIGIN.as_str()).map(str::to_ascii_lowercase) {
            Some(origin) => {
                let same = host
                    .as_deref()
                    .is_some_and(|host| authority(&origin) == Some(host));
                if !same && !self.origins.contains(&origin) {
                    return Err(cross(format!(
                        "a {method} from the page of another origin ({origin:?}) is refused: commands come from this server's own page or from clients that are not browsers"
                    )));
                }
            }
            None => {
                if text(headers, "sec-fetch-site") == Some("cross-site") {
                    return Err(cross(format!(
                        "a {method} that the browser marks cross-site is refused"
                    )));
                }
            }
        }
        Ok(())
    }

    fn allows_host(&self, host: &str) -> bool {
        self.origins
            .iter()
            .any(|origin| authority(origin) == Some(host))
    }
}

/// A header's value as text; `None` when absent or not visible ASCII.
fn text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// `host[:port]` of `scheme://host[:port]`; `None` for anything else (`null`).
fn authority(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    (!rest.is_empty() && !rest.contains('/')).then_some(rest)
}

/// Whether `host` (a `Host` header: `name[:port]`, `[v6][:port]`) names this machine.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || port.strip_prefix(':').is_some_and(is_port) => {
                return v6
                    .parse::<std::net::Ipv6Addr>()
                    .is_ok_and(|ip| ip.is_loopback());
            }
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        }
    };
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A port number's digits.
fn is_port(digits: &str) -> bool {
    !digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn head(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn loopback_names_are_told_from_the_rest() {
        for host in [
            "localhost",
            "localhost:8080",
            "app.localhost:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.9.9.9:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example:8080",
            "10.0.0.1:8080",
            "[::2]:8080",
            "[::1]x",
            "localhost:80x",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn a_command_from_another_origin_is_refused_and_its_own_page_passes() {
        let browsers = Browsers::default();
        let post = Method::POST;
        let foreign = head(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example"),
        ]);
        let other_port = head(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:3000"),
        ]);
        let null = head(&[("host", "127.0.0.1:8080"), ("origin", "null")]);
        let marked = head(&[("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")]);
        for headers in [&foreign, &other_port, &null, &marked] {
            for open in [true, false] {
                let err = browsers.check(headers, &post, open).unwrap_err();
                assert_eq!(
                    (err.status, err.code),
                    (StatusCode::FORBIDDEN, ErrorCode::CrossOrigin)
                );
            }
            // A read is the browser's to guard (no CORS header is ever sent).
            assert!(browsers.check(headers, &Method::GET, false).is_ok());
        }
        let own = head(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        let script = head(&[("host", "127.0.0.1:8080")]);
        for headers in [&own, &script] {
            assert!(browsers.check(headers, &post, true).is_ok());
        }
        let mut allowed = Browsers::default();
        allowed.allow("https://ops.example/");
        let ops = head(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "https://ops.example"),
        ]);
        assert!(allowed.check(&ops, &post, false).is_ok());
    }

    #[test]
    fn with_no_token_a_rebound_name_is_refused_for_reads_too() {
        let browsers = Browsers::default();
        let rebound = head(&[("host", "evil.example:8080")]);
        let err = browsers.check(&rebound, &Method::GET, true).unwrap_err();
        assert_eq!(
            (err.status, err.code),
            (StatusCode::FORBIDDEN, ErrorCode::ForbiddenHost)
        );
        // With tokens the token keeps the page out; the name is not checked.
        assert!(browsers.check(&rebound, &Method::GET, false).is_ok());
        let mut allowed = Browsers::default();
        allowed.allow("http://evil.example:8080");
        assert!(allowed.check(&rebound, &Method::GET, true).is_ok());
    }
}
