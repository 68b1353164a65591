//! The persistent judge: one harness process per device that serves the `evaluate` and
//! `yardstick` requests of a session one after another (`python -m ksearch_harness serve`,
//! harness/ksearch_harness/supervisor.py `serve_loop`).
//!
//! A one-shot harness pays for its interpreter, its imports (numpy, and torch or MLX on a GPU)
//! and its device context in every evaluation; the persistent judge pays once and keeps them,
//! with its caches. What it does not change: every candidate still runs in an accused process
//! of its own, started for its evaluation; the request (with its nonce and secret seed) reaches
//! the judge on stdin, never argv or the environment; results come back, one line per request,
//! on a private pipe (fd 3) that no process running candidate code holds.
//!
//! Failure handling: the harness kills a worker that outlives a request's `timeout_s` and
//! answers `timeout`; if the judge process itself does not answer within the request's timeout
//! plus the grace period, or dies, or the run is interrupted, its whole process group is killed
//! and the next request starts a new one. `KSEARCH_PERSISTENT_JUDGE=0` turns it off (a fresh
//! harness process per evaluation, as for the other ops).

use crate::error::{EvalError, Result};
use crate::harness::{
    harness_command, kill_group, lock, result_pipe, spawn_tail_reader, wait_exited_no_reap,
    Invocation, Outcome, TailBuffer, MAX_RESULT_BYTES,
};
use crate::interrupt::Interrupt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable that turns the persistent judge off (`0`).
pub const PERSISTENT_JUDGE_ENV: &str = "KSEARCH_PERSISTENT_JUDGE";

/// How often a request being waited for looks at its [`Interrupt`].
const INTERRUPT_POLL: Duration = Duration::from_millis(50);

/// Whether evaluations go to a persistent judge (unless `KSEARCH_PERSISTENT_JUDGE=0`).
pub fn enabled() -> bool {
    std::env::var(PERSISTENT_JUDGE_ENV).map_or(true, |v| v.trim() != "0")
}

/// The environment variable that sets how many judges of a device evaluate side by side.
pub const LANES_ENV: &str = "KSEARCH_JUDGE_LANES";

/// How many judges of a device evaluate side by side in a search that keeps `in_flight`
/// candidates in flight (its samples): `KSEARCH_JUDGE_LANES` when set to a number, at most
/// `in_flight` (more would only idle), else one. One is the default: in the one run that
/// compared them on a GPU (docs/results/evaluation-speed, "Lanes"), two lanes made a short run
/// slower, each judge paying the first evaluation's draws, reference outputs and accused
/// start-up of its own.
pub fn lanes(in_flight: u32) -> usize {
    lanes_from(std::env::var(LANES_ENV).ok().as_deref(), in_flight)
}

fn lanes_from(env: Option<&str>, in_flight: u32) -> usize {
    let cap = usize::try_from(in_flight).unwrap_or(usize::MAX).max(1);
    env.and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(1, |n| n.clamp(1, cap))
}

/// A running `serve` process.
pub(crate) struct Judge {
    pid: i32,
    child: Arc<Mutex<Child>>,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Vec<u8>>,
    exited: Arc<AtomicBool>,
    tail: Arc<Mutex<TailBuffer>>,
    dead: bool,
}

impl Judge {
    /// Starts `python -m ksearch_harness serve` for `inv` (its `op` is ignored). The process is
    /// spawned by a thread of its own that lives as long as it does: the harness dies with the
    /// thread that started it (`PR_SET_PDEATHSIG`), and the threads that ask for evaluations
    /// come and go.
    pub(crate) fn spawn(inv: &Invocation<'_>) -> Result<Self> {
        let (result_read, result_write) = result_pipe()?;
        let serve = Invocation {
            op: "serve",
            ..inv.clone()
        };
        let mut cmd = harness_command(&serve, result_write.as_raw_fd());
        let program = inv.python.display().to_string();
        let (spawned_tx, spawned_rx) = mpsc::channel();
        let exited = Arc::new(AtomicBool::new(false));
        let exited_flag = Arc::clone(&exited);
        std::thread::spawn(move || {
            let child = match cmd.spawn() {
                Ok(child) => child,
                Err(e) => {
                    let _ = spawned_tx.send(Err(e));
                    return;
                }
            };
            let pid = child.id() as i32;
            let child = Arc::new(Mutex::new(child));
            if spawned_tx.send(Ok(Arc::clone(&child))).is_err() {
                return;
            }
            wait_exited_no_reap(pid);
            exited_flag.store(true, Ordering::SeqCst);
            // Reaped only after the group is gone (see `kill`), so the id is not reused first.
            kill_group(pid);
            let _ = lock(&child).try_wait();
        });
        let child = spawned_rx
            .recv()
            .map_err(|_| EvalError::Spawn {
                program: program.clone(),
                source: std::io::Error::other("the thread starting the judge ended"),
            })?
            .map_err(|source| EvalError::Spawn { program, source })?;
        // Our copy of the write end must go, or reading the channel would never end.
        drop(result_write);
        let (pid, stdin, stdout, stderr) = {
            let mut c = lock(&child);
            (
                c.id() as i32,
                c.stdin.take(),
                c.stdout.take(),
                c.stderr.take(),
            )
        };
        let tail = Arc::new(Mutex::new(TailBuffer::new(inv.tail_bytes)));
        let (drained_tx, _drained_rx) = mpsc::channel::<()>();
        if let Some(out) = stdout {
            spawn_tail_reader(out, Arc::clone(&tail), drained_tx.clone());
        }
        if let Some(err) = stderr {
            spawn_tail_reader(err, Arc::clone(&tail), drained_tx);
        }
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(std::fs::File::from(result_read));
            loop {
                let mut line = Vec::new();
                match (&mut reader)
                    .take(MAX_RESULT_BYTES as u64)
                    .read_until(b'\n', &mut line)
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if lines_tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        tracing::debug!(pid, "persistent judge started");
        Ok(Judge {
            pid,
            child,
            stdin,
            lines,
            exited,
            tail,
            dead: false,
        })
    }

    /// Whether the process can take another request.
    pub(crate) fn alive(&self) -> bool {
        !self.dead && !self.exited.load(Ordering::SeqCst)
    }

    /// Sends one request and waits for its result line. The judge is left dead (and its group
    /// killed) when it does not answer by `timeout`, exits, or `interrupt` is requested.
    pub(crate) fn serve(
        &mut self,
        request: &[u8],
        timeout: Duration,
        interrupt: Option<&Interrupt>,
    ) -> Result<Outcome> {
        if interrupt.is_some_and(Interrupt::is_requested) {
            // The session is stopping: the judge goes with it.
            self.kill();
            return Err(EvalError::Interrupted);
        }
        let started = Instant::now();
        lock(&self.tail).clear();
        // Stale lines of an earlier request cannot be there (one request at a time, each
        // answered or the judge killed), but a line is only taken as this request's answer.
        while self.lines.try_recv().is_ok() {}
        let sent = match self.stdin.as_mut() {
            Some(stdin) => stdin
                .write_all(request)
                .and_then(|()| stdin.write_all(b"\n"))
                .and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("the judge's stdin is closed")),
        };
        let deadline = started + timeout;
        let mut timed_out = false;
        let mut result = Vec::new();
        if sent.is_ok() {
            loop {
                let now = Instant::now();
                let slice = INTERRUPT_POLL.min(deadline.saturating_duration_since(now));
                match self.lines.recv_timeout(slice) {
                    Ok(line) => {
                        result = line;
                        break;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
                if interrupt.is_some_and(Interrupt::is_requested) {
                    tracing::debug!(pid = self.pid, "interrupted; killing the judge");
                    self.kill();
                    return Err(EvalError::Interrupted);
                }
                if Instant::now() >= deadline {
                    tracing::debug!(pid = self.pid, "the judge did not answer; killing it");
                    timed_out = true;
                    break;
                }
            }
        }
        if result.is_empty() || timed_out {
            self.kill();
        }
        let exit = if self.dead {
            lock(&self.child).try_wait().ok().flatten()
        } else {
            None
        };
        Ok(Outcome {
            result,
            exit,
            timed_out,
            output_tail: lock(&self.tail).text(),
            wall: started.elapsed(),
        })
    }

    /// Kills the judge's process group; the next request starts a new judge.
    pub(crate) fn kill(&mut self) {
        if !self.dead {
            self.stdin = None;
            kill_group(self.pid);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !self.exited.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.dead = true;
    }
}

impl Drop for Judge {
    fn drop(&mut self) {
        // Closing stdin ends the serve loop; a judge that does not go promptly is killed.
        self.stdin = None;
        if !self.dead {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !self.exited.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            kill_group(self.pid);
        }
    }
}

/// The judges of one device: one slot per lane (usually one), each used by one request at a
/// time, and the requests waiting for a free one, served first come, first served.
#[derive(Default)]
struct Lanes {
    slots: Vec<Arc<Mutex<Option<Judge>>>>,
    queue: Mutex<std::collections::VecDeque<u64>>,
    tickets: std::sync::atomic::AtomicU64,
}

/// The judges of one evaluator, per device key.
#[derive(Default)]
pub(crate) struct Judges {
    slots: Mutex<std::collections::HashMap<String, Arc<Lanes>>>,
}

impl std::fmt::Debug for Judges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judges")
            .field("devices", &lock(&self.slots).keys().collect::<Vec<_>>())
            .finish()
    }
}

/// How often a request waiting for a free judge of its device looks again.
const FREE_JUDGE_POLL: Duration = Duration::from_millis(5);

impl Judges {
    /// Serves `request` on a judge for `key`, starting one when there is none (or the last
    /// one died). With `lanes` above one, up to that many judges of the device serve requests
    /// side by side (each request takes a free one, waiting for one when all are busy); their
    /// harness keeps their timed work apart (`KSEARCH_HARNESS_DEVICE_GATE`, in `inv`'s knobs).
    pub(crate) fn serve(
        &self,
        key: &str,
        inv: &Invocation<'_>,
        timeout: Duration,
        lanes: usize,
    ) -> Result<Outcome> {
        let lanes = {
            let mut map = lock(&self.slots);
            let entry = map.entry(key.to_string()).or_default();
            if entry.slots.len() < lanes.max(1) {
                // Lanes are set once per evaluator; more than before only when the first
                // request of a device asked for fewer (never while requests wait).
                let mut grown = Lanes {
                    slots: entry.slots.clone(),
                    ..Lanes::default()
                };
                while grown.slots.len() < lanes.max(1) {
                    grown.slots.push(Arc::default());
                }
                *entry = Arc::new(grown);
            }
            Arc::clone(entry)
        };
        let mut judge = if lanes.slots.len() == 1 {
            lock(&lanes.slots[0])
        } else {
            let ticket = lanes.tickets.fetch_add(1, Ordering::SeqCst);
            lock(&lanes.queue).push_back(ticket);
            loop {
                let first = lock(&lanes.queue).front() == Some(&ticket);
                let free = first.then(|| {
                    lanes.slots.iter().find_map(|s| match s.try_lock() {
                        Ok(free) => Some(free),
                        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                        Err(std::sync::TryLockError::WouldBlock) => None,
                    })
                });
                if let Some(Some(free)) = free {
                    lock(&lanes.queue).pop_front();
                    break free;
                }
                if inv.interrupt.is_some_and(Interrupt::is_requested) {
                    lock(&lanes.queue).retain(|t| *t != ticket);
                    return Err(EvalError::Interrupted);
                }
                std::thread::sleep(FREE_JUDGE_POLL);
            }
        };
        if inv.interrupt.is_some_and(Interrupt::is_requested) {
            if let Some(j) = judge.as_mut() {
                j.kill();
            }
            *judge = None;
            return Err(EvalError::Interrupted);
        }
        if !judge.as_ref().is_some_and(Judge::alive) {
            *judge = Some(Judge::spawn(inv)?);
        }
        let j = judge.as_mut().expect("a judge was just started");
        let outcome = j.serve(inv.request, timeout, inv.interrupt);
        if !j.alive() {
            *judge = None;
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lane_unless_set_and_never_more_than_the_candidates_in_flight() {
        assert_eq!(lanes_from(None, 1), 1);
        assert_eq!(lanes_from(None, 4), 1);
        assert_eq!(lanes_from(Some("2"), 4), 2);
        assert_eq!(lanes_from(Some("3"), 2), 2);
        assert_eq!(lanes_from(Some("2"), 0), 1);
        assert_eq!(lanes_from(Some(" 0 "), 4), 1);
        assert_eq!(lanes_from(Some("many"), 4), 1);
    }
}
