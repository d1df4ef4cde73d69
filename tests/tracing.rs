//! The runtime emits one tracing event per transition (from, to, generation, cause)
//! inside a span named after the task.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

mod support;

use std::sync::{Arc, Mutex};

use support::{scripted, Live};
use taskstage::{Stage, Task};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// One transition event: (span name, from, to, generation, cause).
type Recorded = (String, String, String, String, String);

#[derive(Debug, Default, Clone)]
struct Seen {
    events: Arc<Mutex<Vec<Recorded>>>,
    task_fields: Arc<Mutex<Vec<String>>>,
}

#[derive(Default)]
struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name().to_owned(), value.to_string()));
    }
}

impl Fields {
    fn get(&self, name: &str) -> String {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }
}

impl<S> Layer<S> for Seen
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: Context<'_, S>,
    ) {
        if attrs.metadata().name() == "task" {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            self.task_fields.lock().unwrap().push(fields.get("task"));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.get("message") != "transition" {
            return;
        }
        let span = ctx
            .event_span(event)
            .map(|s| s.name().to_owned())
            .unwrap_or_default();
        self.events.lock().unwrap().push((
            span,
            fields.get("from"),
            fields.get("to"),
            fields.get("generation"),
            fields.get("cause"),
        ));
    }
}

#[test]
fn one_event_per_transition_inside_the_task_span() {
    let seen = Seen::default();
    let subscriber = tracing_subscriber::registry().with(seen.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let live = Live::new();
            let (unit, _remote) = scripted("u", &live);
            let handle = Task::builder("orders-sync").unit(unit).spawn().unwrap();
            handle.wait_for_stage(|s| s == Stage::Running).await;
            handle.pause().await.unwrap();
            let mut observed = handle.subscribe();
            handle.stop().await.unwrap();
            // Observers (logs, then subscribers) are told after the core published,
            // from the thread that made the change: for a stop, the blocking pool's.
            let told = observed.wait_for(|event| event.stage == Stage::Stopped);
            tokio::time::timeout(std::time::Duration::from_secs(20), told)
                .await
                .expect("the subscriber was told of Stopped")
                .expect("the task's channel is open");
        });
    });
    assert_eq!(*seen.task_fields.lock().unwrap(), vec!["orders-sync"]);
    let events = seen.events.lock().unwrap().clone();
    let path: Vec<(&str, &str, &str)> = events
        .iter()
        .map(|(_, from, to, _, cause)| (from.as_str(), to.as_str(), cause.as_str()))
        .collect();
    assert_eq!(
        path,
        vec![
            ("New", "Resuming", "resume"),
            ("Resuming", "Running", "prep ok"),
            ("Running", "Pausing", "pause"),
            ("Pausing", "Paused", "run cancelled"),
            ("Paused", "Stopping", "stop"),
            ("Stopping", "Stopped", "units closed"),
        ]
    );
    assert!(events.iter().all(|(span, ..)| span == "task"));
    assert!(events.iter().all(|(.., generation, _)| generation == "1"));
}
