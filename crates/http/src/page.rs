//! The status page: HTML, CSS and JavaScript compiled into the crate.

use std::sync::OnceLock;

const HTML: &str = include_str!("page/index.html");
const CSS: &str = include_str!("page/style.css");
const JS: &str = include_str!("page/app.js");

/// The page, with its style and script inlined: one answer, and no asset URL to
/// resolve under whatever prefix the router is mounted at.
pub(crate) fn html() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| HTML.replace("/*STYLE*/", CSS).replace("/*SCRIPT*/", JS))
}
