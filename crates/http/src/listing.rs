//! The task list, serialized once per change and shared by every request.
//!
//! A [`Listing`] holds every task's [`Item`] and its JSON text, one after another in
//! one buffer. A source builds a new listing only when its state moved (a cluster:
//! the watched copy of the store changed; one process: some task's change counter or
//! progress moved), and reuses the text of every item that did not change; every
//! request in between is served the same listing, and `GET /v1/tasks` without a
//! filter sends a slice of the buffer as it is (no copy, no serialization).
//!
//! # Invariants
//!
//! 1. `text[bounds[i].0..bounds[i].1]` is exactly `items[i].to_json()` as text, and
//!    the items' texts are separated by one comma: a page of consecutive items is
//!    one slice of `text`.
//! 2. A listing is never changed once built (it is shared behind an `Arc`); a newer
//!    state is a new listing.
//! 3. `counts` holds, for each stage and for the tasks with no stage (a cluster's
//!    task no owner reported), how many of `items` are in it: together, every item
//!    once.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_core::Stream;

use super::Item;
use taskstage::Stage;

/// Every task, with its JSON text (invariant 1).
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub(crate) items: Vec<Item>,
    text: Bytes,
    bounds: Vec<(usize, usize)>,
    /// Tasks per stage, in [`Stage::ALL`]'s order, then those with none
    /// (invariant 3).
    counts: [usize; STAGES + 1],
}

/// How many stages there are.
const STAGES: usize = Stage::ALL.len();

impl Listing {
    /// Serializes every item.
    #[cfg(test)]
    pub(crate) fn new(items: Vec<Item>) -> Self {
        Self::reusing(items, |_| None)
    }

    /// Serializes every item for which `reuse` returns no text (the text of the
    /// same item in an older listing: see [`Listing::text_of`]).
    pub(crate) fn reusing<'a>(
        items: Vec<Item>,
        mut reuse: impl FnMut(usize) -> Option<&'a [u8]>,
    ) -> Self {
        let mut text = Vec::with_capacity(items.len() * 160);
        let mut bounds = Vec::with_capacity(items.len());
        let mut counts = [0; STAGES + 1];
        for (i, item) in items.iter().enumerate() {
            counts[item.stage.map_or(STAGES, |s| s as usize)] += 1;
            if i > 0 {
                text.push(b',');
            }
            let start = text.len();
            match reuse(i) {
                Some(old) => text.extend_from_slice(old),
                None => {
                    // Writing a Value into a Vec cannot fail: its Serialize impl
                    // has no error of its own, and a Vec accepts every byte.
                    let _ = serde_json::to_writer(&mut text, &item.to_json());
                }
            }
            bounds.push((start, text.len()));
        }
        Listing {
            items,
            text: Bytes::from(text),
            bounds,
            counts,
        }
    }

    /// The answer's `counts`: `{"New": n, …, "Finished": n, "none": n}`, over every
    /// task whatever the filter.
    pub(crate) fn counts_json(&self) -> String {
        let mut out = String::from("{");
        for (i, stage) in Stage::ALL.iter().enumerate() {
            out.push_str(&format!("\"{}\":{},", stage.name(), self.counts[i]));
        }
        out.push_str(&format!("\"none\":{}}}", self.counts[STAGES]));
        out
    }

    /// The JSON text of item `i`.
    pub(crate) fn text_of(&self, i: usize) -> Option<&[u8]> {
        let (start, end) = *self.bounds.get(i)?;
        self.text.get(start..end)
    }

    /// The answer of `GET /v1/tasks`: the items at `selected` (indices, in order;
    /// `None`: every item), from `offset`, at most `limit`.
    pub(crate) fn page(
        &self,
        selected: Option<&[usize]>,
        offset: usize,
        limit: usize,
        seq: u64,
    ) -> Response {
        let total = selected.map_or(self.items.len(), <[usize]>::len);
        let counts = self.counts_json();
        let head = format!(
            "{{\"total\":{total},\"offset\":{offset},\"limit\":{limit},\"seq\":{seq},\"counts\":{counts},\"items\":["
        );
        let mut chunks = VecDeque::from([Bytes::from(head)]);
        let first = offset.min(total);
        let last = offset.saturating_add(limit).min(total);
        match selected {
            // Consecutive items: one slice of the shared text (invariant 1).
            None => {
                if let (Some(&(start, _)), Some(&(_, end))) = (
                    self.bounds.get(first),
                    last.checked_sub(1).and_then(|l| self.bounds.get(l)),
                ) {
                    if first < last {
                        chunks.push_back(self.text.slice(start..end));
                    }
                }
            }
            Some(indices) => {
                let page = indices.get(first..last).unwrap_or_default();
                let mut text = Vec::with_capacity(page.len() * 160);
                for (n, &i) in page.iter().enumerate() {
                    if n > 0 {
                        text.push(b',');
                    }
                    text.extend_from_slice(self.text_of(i).unwrap_or(b"null"));
                }
                chunks.push_back(Bytes::from(text));
            }
        }
        chunks.push_back(Bytes::from_static(b"]}"));
        let mut response = (StatusCode::OK, Body::from_stream(Chunks(chunks))).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

/// A body sent as the chunks it was built from.
struct Chunks(VecDeque<Bytes>);

impl Stream for Chunks {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.get_mut().0.pop_front().map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn item(id: &str) -> Item {
        Item {
            id: Arc::from(id),
            stage: Some(taskstage::Stage::Running),
            desired: None,
            owner: None,
            token: None,
            since: Some(7),
            outcome: None,
            progress: Some((1, Some(2))),
            user_paused: Some(false),
            policy: None,
        }
    }

    #[test]
    fn the_counts_hold_every_item_once_under_its_stage() {
        let mut paused = item("p");
        paused.stage = Some(taskstage::Stage::Paused);
        let mut unreported = item("u");
        unreported.stage = None;
        let listing = Listing::new(vec![item("a"), item("b"), paused, unreported]);
        let counts: serde_json::Value = serde_json::from_str(&listing.counts_json()).expect("JSON");
        assert_eq!(counts["Running"], 2, "{counts}");
        assert_eq!(counts["Paused"], 1, "{counts}");
        assert_eq!(counts["none"], 1, "{counts}");
        let sum: u64 = counts
            .as_object()
            .expect("an object")
            .values()
            .filter_map(serde_json::Value::as_u64)
            .sum();
        assert_eq!(sum, 4, "{counts}");
        assert_eq!(counts.as_object().map(|o| o.len()), Some(9), "{counts}");
    }

    #[test]
    fn each_text_is_its_items_json_and_reused_text_is_kept() {
        let listing = Listing::new(vec![item("a"), item("b"), item("c")]);
        for (i, it) in listing.items.iter().enumerate() {
            let text = listing.text_of(i).expect("a text");
            let parsed: serde_json::Value = serde_json::from_slice(text).expect("JSON");
            assert_eq!(parsed, it.to_json());
        }
        let again = Listing::reusing(vec![item("a"), item("x")], |i| {
            (i == 0).then(|| listing.text_of(0)).flatten()
        });
        assert_eq!(again.text_of(0), listing.text_of(0));
        // A reused text is taken as it is, not serialized again.
        let kept: &[u8] = br#"{"id":"a","kept":true}"#;
        let reused = Listing::reusing(vec![item("a")], |_| Some(kept));
        assert_eq!(
            reused.text_of(0),
            Some(kept),
            "the reused text was not kept"
        );
        let parsed: serde_json::Value =
            serde_json::from_slice(again.text_of(1).expect("a text")).expect("JSON");
        assert_eq!(parsed["id"], "x");
        assert_eq!(
            &again.text[..],
            [
                listing.text_of(0).unwrap_or_default(),
                b",",
                again.text_of(1).unwrap_or_default()
            ]
            .concat()
        );
    }
}
