//! Every channel tells the same stage at the same time: once a command (or a wait for
//! a stage) returns stage S, `stage()`, the latest change of `subscribe()`, the
//! changes `events()` has delivered, the last tracing transition event and (feature
//! `metrics`) the `taskstage_tasks{stage}` gauges all show S. On both runtimes, for
//! every command, a stop at rest (whose closes run on tokio's blocking pool)
//! included.
//!
//! One test function, so that the process-wide tracing subscriber and metrics
//! recorder see this test's tasks only.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

use std::sync::{Arc, Mutex};
use std::task::Poll;

use taskstage::{Event, Events, Handle, RunContext, RunError, RunExit, Stage, Task, Unit};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The last `to` of a tracing transition event.
#[derive(Debug, Default, Clone)]
struct LastTransition(Arc<Mutex<Option<String>>>);

struct To(Option<String>, bool);

impl Visit for To {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "to" => self.0 = Some(format!("{value:?}")),
            "message" => self.1 = format!("{value:?}") == "transition",
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for LastTransition {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut to = To(None, false);
        event.record(&mut to);
        if let To(Some(stage), true) = to {
            *self.0.lock().unwrap() = Some(stage);
        }
    }
}

/// Runs until cancelled; its close takes a moment, as a flush does.
struct Wait;

impl Unit for Wait {
    async fn run(&mut self, ctx: RunContext) -> Result<RunExit, RunError> {
        ctx.cancelled().await;
        Ok(RunExit::Cancelled)
    }

    fn close(&mut self) {
        std::thread::yield_now();
    }
}

/// Completes at once.
struct Done;

impl Unit for Done {
    async fn run(&mut self, _ctx: RunContext) -> Result<RunExit, RunError> {
        Ok(RunExit::Completed)
    }
}

#[cfg(feature = "metrics")]
type Snapshotter = metrics_util::debugging::Snapshotter;
#[cfg(not(feature = "metrics"))]
type Snapshotter = ();

/// One task under watch: its handle and the channels opened at its spawn.
struct Watched {
    handle: Handle,
    subscriber: tokio::sync::watch::Receiver<taskstage::runtime::StageEvent>,
    events: Events,
    last_event: Option<Stage>,
}

impl Watched {
    fn new(handle: Handle, events: Events) -> Self {
        Watched {
            subscriber: handle.subscribe(),
            handle,
            events,
            last_event: None,
        }
    }
}

struct Channels {
    tracing: LastTransition,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    metrics: Snapshotter,
    /// Every task of the test, kept alive so that the gauges count each of them.
    all: Vec<Handle>,
    /// The gauges' values, by stage.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    gauges: Mutex<std::collections::HashMap<String, f64>>,
}

impl Channels {
    /// Asserts that every channel of `task` shows `stage`, right now, after `what`.
    async fn agree(&self, task: &mut Watched, stage: Stage, what: &str) {
        assert_eq!(task.handle.stage(), stage, "{what}: stage()");
        assert_eq!(
            task.subscriber.borrow().stage,
            stage,
            "{what}: subscribe()'s latest change"
        );
        // Every change delivered so far, without waiting for more.
        loop {
            let next = std::future::poll_fn(|cx| {
                Poll::Ready(
                    match futures_core::Stream::poll_next(std::pin::Pin::new(&mut task.events), cx)
                    {
                        Poll::Ready(item) => Some(item),
                        Poll::Pending => None,
                    },
                )
            })
            .await;
            match next {
                Some(Some(Event::Change(change))) => task.last_event = Some(change.stage),
                Some(Some(Event::Lagged { .. })) => panic!("{what}: events lagged"),
                Some(None) | None => break,
            }
        }
        assert_eq!(task.last_event, Some(stage), "{what}: events()");
        let traced = self.tracing.0.lock().unwrap().clone();
        assert_eq!(traced.as_deref(), Some(stage.name()), "{what}: tracing");
        #[cfg(feature = "metrics")]
        self.gauges_agree(what);
    }

    #[cfg(feature = "metrics")]
    fn gauges_agree(&self, what: &str) {
        use metrics_util::debugging::DebugValue;
        // A snapshot of the debugging recorder resets what it reports: the gauges are
        // the sums of what every snapshot saw.
        let seen = self.metrics.snapshot().into_vec();
        let mut gauges = self.gauges.lock().unwrap();
        for (key, _, _, value) in seen {
            if key.key().name() != "taskstage_tasks" {
                continue;
            }
            let Some(stage) = key.key().labels().find(|l| l.key() == "stage") else {
                continue;
            };
            let DebugValue::Gauge(v) = value else {
                panic!("not a gauge: {value:?}")
            };
            *gauges.entry(stage.value().to_owned()).or_default() += v.into_inner();
        }
        for stage in Stage::ALL {
            let gauge = gauges.get(stage.name()).copied().unwrap_or(0.0);
            let tasks = self.all.iter().filter(|t| t.stage() == stage).count();
            assert_eq!(
                gauge, tasks as f64,
                "{what}: taskstage_tasks{{stage={stage}}}"
            );
        }
    }

    async fn scenarios(&mut self) {
        // Every command on a running task.
        let (handle, events) = Task::builder("a").unit(Wait).spawn_with_events().unwrap();
        self.all.push(handle.clone());
        let mut a = Watched::new(handle, events);
        a.handle.wait_for_stage(|s| s == Stage::Running).await;
        self.agree(&mut a, Stage::Running, "started").await;
        let paused = a.handle.pause().await.unwrap();
        self.agree(&mut a, paused, "pause").await;
        a.handle.resume().await.unwrap();
        a.handle.wait_for_stage(|s| s == Stage::Running).await;
        self.agree(&mut a, Stage::Running, "resumed").await;
        let stopped = a.handle.stop().await.unwrap();
        self.agree(&mut a, stopped, "stop of a running task").await;

        // A stop at rest: Paused, then New. Its closes run on the blocking pool.
        let (handle, events) = Task::builder("b").unit(Wait).spawn_with_events().unwrap();
        self.all.push(handle.clone());
        let mut b = Watched::new(handle, events);
        b.handle.wait_for_stage(|s| s == Stage::Running).await;
        let paused = b.handle.pause().await.unwrap();
        self.agree(&mut b, paused, "pause").await;
        let stopped = b.handle.stop().await.unwrap();
        self.agree(&mut b, stopped, "stop of a paused task").await;

        let handle = Task::builder("c").unit(Wait).spawn_paused().unwrap();
        let events = handle.events();
        self.all.push(handle.clone());
        let mut c = Watched::new(handle, events);
        c.handle.resume().await.unwrap();
        c.handle.wait_for_stage(|s| s == Stage::Running).await;
        let paused = c.handle.pause().await.unwrap();
        self.agree(&mut c, paused, "pause").await;
        let stopped = c.handle.stop_now().unwrap().await.unwrap();
        self.agree(&mut c, stopped, "stop_now of a paused task")
            .await;

        // A task that ends by itself.
        let (handle, events) = Task::builder("d").unit(Done).spawn_with_events().unwrap();
        self.all.push(handle.clone());
        let mut d = Watched::new(handle, events);
        let done = d.handle.wait_for_stage(Stage::is_terminal).await;
        self.agree(&mut d, done.stage, "finished").await;
        let stopped = d.handle.stop().await.unwrap();
        self.agree(&mut d, stopped, "stop of a finished task").await;
    }
}

#[test]
fn every_channel_tells_the_stage_a_command_returned() {
    let tracing = LastTransition::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(tracing.clone()))
        .expect("the only subscriber of this test binary");
    #[cfg(feature = "metrics")]
    let metrics = {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
        snapshotter
    };
    #[cfg(not(feature = "metrics"))]
    let metrics = ();
    let mut channels = Channels {
        tracing,
        metrics,
        all: Vec::new(),
        gauges: Mutex::default(),
    };
    for round in 0..20 {
        let current = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        current.block_on(channels.scenarios());
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        multi.block_on(channels.scenarios());
        let _ = round;
    }
}
