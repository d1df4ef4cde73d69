//! The overload faults, for the fault suite and the scale run: CPU-bound processes
//! beside the cluster, units that block their runtime's threads, a duty-cycle freeze
//! of one worker process; and what a supervisor does when a worker ends itself
//! because its run overran its lease.
//!
//! Every process these start is a child of the caller and is stopped by pid when its
//! guard drops, also when a test fails or a run is interrupted; a process frozen by
//! [`DutyCycle`] is always thawed at the end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};

use super::history::{Fault, Recorder};
use super::ChildGuard;

/// The exit status of a worker process that ended itself because a run was not
/// confirmed gone by its lease's last safe instant.
pub use taskstage_cluster::OVERRUN_EXIT_CODE;

/// How many CPU-bound processes load every core: two per core the machine has, so
/// that every process beside them (etcd members, workers, the run itself) waits for
/// a core about two thirds of the time, at equal priority.
pub fn hogs_per_core() -> usize {
    2 * std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// CPU-bound processes; dropping this kills each one by pid.
pub struct Hogs {
    children: Vec<ChildGuard>,
}

impl Hogs {
    /// Starts `n` CPU-bound processes at the caller's priority. Each is a shell loop
    /// that does no I/O and ends by itself after `bound` (bash's own clock, no
    /// process per turn), or as soon as its parent is gone.
    ///
    /// # Errors
    ///
    /// If a process cannot be started; those started before it are killed.
    pub fn start(n: usize, bound: Duration) -> std::io::Result<Hogs> {
        let script = format!(
            "while ((SECONDS < {})); do kill -0 $PPID || exit 0; done",
            bound.as_secs().max(1)
        );
        let mut hogs = Hogs {
            children: Vec::with_capacity(n),
        };
        for _ in 0..n {
            let child = std::process::Command::new("bash")
                .args(["-c", &script])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()?;
            hogs.children.push(ChildGuard::new(child));
        }
        Ok(hogs)
    }

    /// The pids of the hogs.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(ChildGuard::pid).collect()
    }
}

/// How a worker process's units block their runtime's threads: every `every`, as
/// many units as the runtime has threads each spin for `span` inside their run,
/// without yielding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The period of the blocking windows.
    pub every: Duration,
    /// How long each blocking unit spins.
    pub span: Duration,
}

impl Block {
    /// `{every ms},{span ms}`, as a worker's argument or variable carries it.
    pub fn to_arg(self) -> String {
        format!("{},{}", self.every.as_millis(), self.span.as_millis())
    }

    /// The inverse of [`Block::to_arg`]; `None` for anything else, or a span not
    /// shorter than the period.
    pub fn parse(text: &str) -> Option<Block> {
        let (every, span) = text.split_once(',')?;
        let every = Duration::from_millis(every.parse().ok()?);
        let span = Duration::from_millis(span.parse().ok()?);
        (!span.is_zero() && span < every).then_some(Block { every, span })
    }
}

/// At most this many blocking windows per run (about 55 h at 2 s): the run ends
/// long before.
const MAX_WINDOWS: u64 = 100_000;

/// One worker process's blocking schedule, shared by all its units: at the start of
/// each window, the first `threads` units to wake take a ticket each and spin for
/// the span. With as many tickets as the runtime has threads, and every unit woken
/// at the same instant (an idle runtime thread steals the woken units of a busy
/// one), every thread of the runtime is held for about the span.
#[derive(Debug)]
pub struct Blocker {
    block: Block,
    /// Per ticket, the last window it was taken in (windows count from 1).
    tickets: Vec<AtomicU64>,
    epoch: Instant,
}

impl Blocker {
    /// The schedule `block` for a runtime of `threads` threads.
    pub fn new(block: Block, threads: usize) -> Arc<Blocker> {
        Arc::new(Blocker {
            block,
            tickets: (0..threads.max(1)).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
        })
    }

    /// Runs beside a unit's work inside its run, selected with it: waits for each
    /// window and, with a ticket, spins for the span without yielding, so that the
    /// runtime thread polling the run is held. Returns after [`MAX_WINDOWS`]
    /// windows; dropped with the run before that.
    pub async fn pulse(&self) {
        let every = self.block.every.as_nanos().max(1);
        for _ in 0..MAX_WINDOWS {
            let window = self.epoch.elapsed().as_nanos() / every + 1;
            let start = self.epoch + Duration::from_nanos((window * every) as u64);
            let window = window as u64;
            tokio::time::sleep_until(tokio::time::Instant::from_std(start)).await;
            if self.take_ticket(window) {
                let until = Instant::now() + self.block.span;
                // Bounded by the span: a busy loop that never yields to the runtime.
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// Takes one of the window's tickets, if one is left.
    fn take_ticket(&self, window: u64) -> bool {
        self.tickets.iter().any(|ticket| {
            // Relaxed: each ticket is a counter of its own, and nothing else is
            // published through it.
            let last = ticket.load(Ordering::Relaxed);
            last < window
                && ticket
                    .compare_exchange(last, window, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
        })
    }
}

/// A duty-cycle freeze of one child process, from a thread of its own: SIGSTOP,
/// `stopped`, SIGCONT, `running`, again and again for `span`, then SIGCONT for good.
/// The signals go through a pidfd opened at the start, so they can only ever reach
/// that process, even once it is gone and its pid reused. Dropping the guard ends
/// the cycle early and thaws the process.
pub struct DutyCycle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<usize>>,
    pidfd: Option<Arc<rustix::fd::OwnedFd>>,
}

impl DutyCycle {
    /// Starts the cycle on process `pid`, a child of this process not yet reaped.
    ///
    /// # Errors
    ///
    /// If the process cannot be opened (it is gone): nothing was frozen.
    pub fn start(
        pid: u32,
        stopped: Duration,
        running: Duration,
        span: Duration,
    ) -> std::io::Result<DutyCycle> {
        let pid = Pid::from_raw(pid as i32)
            .ok_or_else(|| std::io::Error::other(format!("pid {pid} is not a process")))?;
        let pidfd = Arc::new(rustix::process::pidfd_open(
            pid,
            rustix::process::PidfdFlags::empty(),
        )?);
        let stop = Arc::new(AtomicBool::new(false));
        let period = (stopped + running).max(Duration::from_millis(1));
        let cycles = span.as_nanos().div_ceil(period.as_nanos()) as usize;
        let thread = {
            let (stop, pidfd) = (Arc::clone(&stop), Arc::clone(&pidfd));
            std::thread::spawn(move || {
                let deadline = Instant::now() + span;
                let mut done = 0;
                // Bounded by the count of cycles and by the deadline.
                for _ in 0..cycles {
                    // Acquire: pairs with the guard's Release store; nothing else
                    // is read through it, the flag alone ends the cycle.
                    if stop.load(Ordering::Acquire) || Instant::now() >= deadline {
                        break;
                    }
                    if rustix::process::pidfd_send_signal(&*pidfd, Signal::STOP).is_err() {
                        break;
                    }
                    std::thread::sleep(stopped);
                    let thawed = rustix::process::pidfd_send_signal(&*pidfd, Signal::CONT);
                    done += 1;
                    if thawed.is_err() {
                        break;
                    }
                    std::thread::sleep(running);
                }
                let _ = rustix::process::pidfd_send_signal(&*pidfd, Signal::CONT);
                done
            })
        };
        Ok(DutyCycle {
            stop,
            thread: Some(thread),
            pidfd: Some(pidfd),
        })
    }

    /// Whether the cycle has ended (its span passed, or its process is gone).
    pub fn is_done(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the cycle to end by itself (at most its span), thaws the process;
    /// returns how many freezes it made.
    pub fn finish(mut self) -> usize {
        self.end(false)
    }

    fn end(&mut self, early: bool) -> usize {
        if early {
            // Release: pairs with the thread's Acquire load.
            self.stop.store(true, Ordering::Release);
        }
        let done = self
            .thread
            .take()
            .map_or(0, |thread| thread.join().unwrap_or(0));
        if let Some(pidfd) = self.pidfd.take() {
            let _ = rustix::process::pidfd_send_signal(&*pidfd, Signal::CONT);
        }
        done
    }
}

impl Drop for DutyCycle {
    fn drop(&mut self) {
        self.end(true);
    }
}

/// Watches child `pid` of this process from a thread of its own: the instant it
/// exits, for whatever reason, records `exited` for it in `recorder` (none of its
/// runs is alive from then on), then calls `exited` with its pid. It reaps nothing:
/// the process's guard does, and reads its status. Also ends, recording nothing,
/// when the process was reaped first (whoever reaped it then records it gone).
pub fn watch_exit(pid: u32, recorder: Arc<Recorder>, exited: impl FnOnce(u32) + Send + 'static) {
    let Some(id) = Pid::from_raw(pid as i32) else {
        return;
    };
    std::thread::spawn(move || {
        // Bounded by the child's life (its guard kills it at the latest), and by
        // 1,000 interruptions.
        for _ in 0..1_000 {
            match rustix::process::waitid(
                WaitId::Pid(id),
                WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
            ) {
                Ok(_) => {
                    recorder.fault(Fault::Exited, pid);
                    exited(pid);
                    return;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    });
}

/// Whether `status` is the exit of a worker that ended itself on an overrun.
pub fn is_overrun(status: std::process::ExitStatus) -> bool {
    status.code() == Some(OVERRUN_EXIT_CODE)
}

/// How many times the worker processes whose logs are in `dir` (`*.log`) joined
/// again after losing their lease (each says `joining again` in its log).
pub fn rejoins(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|text| text.lines().filter(|l| l.contains("joining again")).count())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_goes_through_its_argument_unchanged_and_bad_ones_are_refused() {
        let block = Block {
            every: Duration::from_secs(2),
            span: Duration::from_millis(150),
        };
        assert_eq!(block.to_arg(), "2000,150");
        assert_eq!(Block::parse(&block.to_arg()), Some(block));
        for bad in [
            "", "2000", "2000,", "x,150", "150,2000", "2000,0", "100,100",
        ] {
            assert_eq!(Block::parse(bad), None, "{bad:?}");
        }
    }

    /// A child of this test, killed by pid when the guard drops.
    fn child(script: &str) -> ChildGuard {
        let child = std::process::Command::new("sh")
            .args(["-c", script])
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("start sh");
        ChildGuard::new(child)
    }

    /// The state letter of process `pid` (`T`: stopped), from `/proc/PID/stat`.
    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 1..].trim_start().chars().next()
    }

    #[test]
    fn an_overrun_exit_is_recorded_when_it_happens_and_read_as_an_overrun() {
        let dir = std::env::temp_dir().join(format!(
            "taskstage-overload-{}-{}",
            std::process::id(),
            super::super::history::now_ns()
        ));
        let recorder = Recorder::create(&dir, "test").expect("a history");
        let mut worker = child(&format!("sleep 0.2; exit {OVERRUN_EXIT_CODE}"));
        let (tx, rx) = std::sync::mpsc::channel();
        watch_exit(worker.pid(), recorder, move |pid| {
            let _ = tx.send(pid);
        });
        let seen = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the exit seen within 10 s");
        assert_eq!(seen, worker.pid());
        let text = std::fs::read_to_string(dir.join("test.history")).expect("the history");
        assert!(
            text.ends_with(&format!(" {seen}\n")) && text.starts_with("exited "),
            "{text:?}"
        );
        let status = worker.try_wait().expect("not reaped by the watcher");
        assert!(is_overrun(status), "{status}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_duty_cycle_always_ends_with_its_process_thawed() {
        // `exec`: the pid frozen and killed is the sleep itself, not a shell that
        // would leave it running when killed.
        let sleeper = child("exec sleep 30");
        let pid = sleeper.pid();
        let ms = Duration::from_millis;
        // Ended early, by the guard's drop, in the middle of a stop.
        let freeze = DutyCycle::start(pid, ms(200), ms(10), Duration::from_secs(10))
            .expect("start a duty cycle");
        let deadline = Instant::now() + Duration::from_secs(5);
        // Bounded by the deadline, polling every 5 ms.
        while state(pid) != Some('T') {
            assert!(Instant::now() < deadline, "never stopped: {:?}", state(pid));
            std::thread::sleep(ms(5));
        }
        drop(freeze);
        let deadline = Instant::now() + Duration::from_secs(5);
        // Bounded by the deadline, polling every 5 ms (SIGCONT is delivered at once,
        // /proc may show it a moment later).
        while state(pid) == Some('T') {
            assert!(Instant::now() < deadline, "left stopped after the drop");
            std::thread::sleep(ms(5));
        }
        // Run to its end: a few cycles, then thawed.
        let freeze = DutyCycle::start(pid, ms(20), ms(10), ms(100)).expect("start again");
        let deadline = Instant::now() + Duration::from_secs(5);
        // Bounded by the deadline, polling every 5 ms.
        while !freeze.is_done() {
            assert!(Instant::now() < deadline, "a 100 ms cycle still running");
            std::thread::sleep(ms(5));
        }
        let cycles = freeze.finish();
        assert!((1..=4).contains(&cycles), "{cycles} cycles in 100 ms");
        assert_ne!(state(pid), Some('T'), "left stopped at the end");
    }

    #[test]
    fn each_window_has_as_many_tickets_as_threads() {
        let blocker = Blocker::new(
            Block {
                every: Duration::from_secs(2),
                span: Duration::from_millis(1),
            },
            2,
        );
        assert!(blocker.take_ticket(1));
        assert!(blocker.take_ticket(1));
        assert!(!blocker.take_ticket(1), "a third ticket in window 1");
        assert!(blocker.take_ticket(2));
        assert!(blocker.take_ticket(2));
        assert!(!blocker.take_ticket(2), "a third ticket in window 2");
    }
}
