//! Running one harness operation in a child process.
//!
//! The child gets a scrubbed environment (no API keys, no ksearch secrets), its own process
//! group (so a timeout can kill everything the candidate started), the request on stdin, and a
//! private pipe on fd 3 for its single result line. Its stdout and stderr are kept only as a
//! bounded tail: a candidate that prints gigabytes must not exhaust our memory.

use crate::error::{EvalError, Result};
use crate::interrupt::Interrupt;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The file descriptor number the harness writes its result to (`--result-fd 3`).
pub const RESULT_FD: i32 = 3;

/// Variables passed through from our environment. Everything else is dropped: the ksearch
/// process holds LLM API keys that candidate code must never see. `LD_LIBRARY_PATH` and
/// `CUDA_HOME` are here because CUDA toolkits outside the default paths are found through them;
/// `KSEARCH_CUDA_ARCH` is the cuda backend's documented architecture override (its
/// `KSEARCH_HARNESS_CUDA_ARCH` spelling passes as a knob), no secret.
const PASSED_THROUGH: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "TMPDIR",
    "CC",
    "CXX",
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "KSEARCH_CUDA_ARCH",
];

/// The Python package the protocol ops run from (`python -m ksearch_harness <op>`).
pub const HARNESS_MODULE: &str = "ksearch_harness";

/// Prefix of the harness's own tuning knobs, which are passed through.
pub const KNOB_PREFIX: &str = "KSEARCH_HARNESS_";

/// Upper bound on the result line; a result is a few hundred kilobytes at most, so more means
/// something other than the harness is writing to the channel.
pub(crate) const MAX_RESULT_BYTES: usize = 64 << 20;

/// How long to wait for output pipes to drain after the process group is gone. A process that
/// left the group (`setsid`) could hold them open for ever; we do not wait for it.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// How often a harness being waited for looks at its [`Interrupt`].
const INTERRUPT_POLL: Duration = Duration::from_millis(50);

/// One harness invocation.
#[derive(Debug, Clone)]
pub struct Invocation<'a> {
    pub python: &'a Path,
    pub harness_dir: &'a Path,
    /// The module run with `python -m`: [`HARNESS_MODULE`] for the protocol ops, a module of
    /// the harness package for tools outside the protocol (`ksearch_harness.bench`).
    pub module: &'a str,
    pub op: &'a str,
    pub request: &'a [u8],
    pub cwd: &'a Path,
    /// Wall-clock limit after which the whole process group is killed.
    pub timeout: Duration,
    /// Extra `KSEARCH_HARNESS_*` knobs on top of those in our own environment.
    pub knobs: &'a [(String, String)],
    /// Bytes of stdout/stderr kept.
    pub tail_bytes: usize,
    /// When requested, the process group is killed and [`EvalError::Interrupted`] returned.
    pub interrupt: Option<&'a Interrupt>,
}

/// What came back from the child.
#[derive(Debug)]
pub struct Outcome {
    /// Bytes read from the result channel (fd 3).
    pub result: Vec<u8>,
    /// `None` when the process could not be reaped (it was not seen to exit).
    pub exit: Option<ExitStatus>,
    pub timed_out: bool,
    /// Tail of stdout and stderr, interleaved in arrival order.
    pub output_tail: String,
    pub wall: Duration,
}

impl Outcome {
    /// Human description of how the process ended.
    pub fn exit_description(&self) -> String {
        match self.exit {
            None => "unknown".into(),
            Some(s) => match (s.code(), s.signal()) {
                (Some(code), _) => format!("code {code}"),
                (None, Some(sig)) => match Signal::try_from(sig) {
                    Ok(name) => format!("signal {name}"),
                    Err(_) => format!("signal {sig}"),
                },
                _ => "unknown".into(),
            },
        }
    }

    /// The signal that killed the process, if one did.
    pub fn signal(&self) -> Option<i32> {
        self.exit.and_then(|s| s.signal())
    }
}

/// The environment an interpreter is probed in before it is chosen for the harness
/// (harness_env): what the harness would get, without the harness package on `PYTHONPATH`, so
/// an import that works in the probe works in the harness.
pub(crate) fn probe_env(
    parent: impl Iterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    parent
        .filter(|(key, _)| {
            key.to_str()
                .is_some_and(|name| name == "PYTHONPATH" || PASSED_THROUGH.contains(&name))
        })
        .collect()
}

/// The scrubbed environment for the child.
pub fn child_env(
    harness_dir: &Path,
    knobs: &[(String, String)],
    parent: impl Iterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    let mut parent_pythonpath = None;
    for (key, value) in parent {
        let Some(name) = key.to_str() else { continue };
        if name == "PYTHONPATH" {
            parent_pythonpath = Some(value);
        } else if PASSED_THROUGH.contains(&name) || name.starts_with(KNOB_PREFIX) {
            env.push((key, value));
        }
    }
    // The harness must win over anything else named ksearch_harness on the user's path.
    let mut paths = vec![harness_dir.to_path_buf()];
    if let Some(extra) = parent_pythonpath {
        paths.extend(std::env::split_paths(&extra));
    }
    if let Ok(joined) = std::env::join_paths(paths) {
        env.push(("PYTHONPATH".into(), joined));
    }
    // Output printed just before a crash must reach the log tail.
    env.push(("PYTHONUNBUFFERED".into(), "1".into()));
    for (k, v) in knobs {
        env.retain(|(key, _)| key != k.as_str());
        env.push((k.into(), v.into()));
    }
    env
}

/// Runs one harness operation. `Err` only when the process could not be started or supervised;
/// everything the child does (crash, hang, garbage) is described by the returned [`Outcome`].
pub fn run(inv: &Invocation<'_>) -> Result<Outcome> {
    if inv.interrupt.is_some_and(Interrupt::is_requested) {
        return Err(EvalError::Interrupted);
    }
    let (result_read, result_write) = result_pipe()?;
    let mut cmd = harness_command(inv, result_write.as_raw_fd());

    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|source| EvalError::Spawn {
        program: inv.python.display().to_string(),
        source,
    })?;
    // Our copy of the write end must go, or reading the channel would never see end-of-file.
    drop(result_write);
    let pid = child.id() as i32;

    // The child may never read stdin; writing from a thread keeps the timeout in charge.
    let mut stdin = child.stdin.take();
    let request = inv.request.to_vec();
    std::thread::spawn(move || {
        if let Some(stdin) = stdin.as_mut() {
            let _ = stdin.write_all(&request);
        }
        // Dropping closes stdin: the harness loads the candidate only after end-of-file.
    });

    let tail = Arc::new(Mutex::new(TailBuffer::new(inv.tail_bytes)));
    let (drained_tx, drained_rx) = mpsc::channel::<()>();
    let mut readers = 0;
    if let Some(out) = child.stdout.take() {
        spawn_tail_reader(out, Arc::clone(&tail), drained_tx.clone());
        readers += 1;
    }
    if let Some(err) = child.stderr.take() {
        spawn_tail_reader(err, Arc::clone(&tail), drained_tx.clone());
        readers += 1;
    }
    let result_buf = Arc::new(Mutex::new(Vec::new()));
    {
        let buf = Arc::clone(&result_buf);
        let tx = drained_tx.clone();
        std::thread::spawn(move || {
            read_bounded(std::fs::File::from(result_read), &buf, MAX_RESULT_BYTES);
            let _ = tx.send(());
        });
        readers += 1;
    }
    drop(drained_tx);

    let (exited_tx, exited_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        wait_exited_no_reap(pid);
        let _ = exited_tx.send(());
    });

    let mut timed_out = false;
    let mut interrupted = false;
    let deadline = started + inv.timeout;
    loop {
        // Short waits when someone may ask us to stop, one wait otherwise.
        let now = Instant::now();
        let slice = match inv.interrupt {
            Some(_) => INTERRUPT_POLL.min(deadline.saturating_duration_since(now)),
            None => deadline.saturating_duration_since(now),
        };
        match exited_rx.recv_timeout(slice) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if inv.interrupt.is_some_and(Interrupt::is_requested) {
            interrupted = true;
            tracing::debug!(
                pid,
                op = inv.op,
                "interrupted; killing the harness process group"
            );
        } else if Instant::now() >= deadline {
            timed_out = true;
            tracing::debug!(
                pid,
                op = inv.op,
                "harness timed out; killing its process group"
            );
        } else {
            continue;
        }
        kill_group(pid);
        let _ = exited_rx.recv_timeout(Duration::from_secs(30));
        break;
    }
    let wall = started.elapsed();
    // The leader is a zombie now, not yet reaped, so its process group id cannot have been
    // reused: killing the group reaches only what the candidate left running.
    kill_group(pid);
    let exit = child.try_wait().ok().flatten();

    let deadline = Instant::now() + DRAIN_GRACE;
    for _ in 0..readers {
        let left = deadline.saturating_duration_since(Instant::now());
        if drained_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    if interrupted {
        return Err(EvalError::Interrupted);
    }
    let result = lock(&result_buf).clone();
    let output_tail = lock(&tail).text();
    Ok(Outcome {
        result,
        exit,
        timed_out,
        output_tail,
        wall,
    })
}

/// The command that starts a harness process for `inv`: `python -m <module> <op> --result-fd 3`
/// with a scrubbed environment, its own process group, piped stdio, `write_raw` (the result
/// pipe's write end) on fd 3, and death with the thread that started it.
pub(crate) fn harness_command(inv: &Invocation<'_>, write_raw: i32) -> Command {
    let mut cmd = Command::new(inv.python);
    cmd.args(["-m", inv.module, inv.op, "--result-fd"])
        .arg(RESULT_FD.to_string())
        .env_clear()
        .envs(child_env(inv.harness_dir, inv.knobs, std::env::vars_os()))
        .current_dir(inv.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls
    // (dup2, fcntl, prctl) on a descriptor number captured by value.
    unsafe {
        cmd.pre_exec(move || {
            if write_raw == RESULT_FD {
                // dup2 onto itself would keep close-on-exec set.
                if libc::fcntl(RESULT_FD, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(write_raw, RESULT_FD) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // A harness outliving a killed ksearch would go on building and timing beside the
            // next session; it dies with the thread that started it (which waits for it).
            #[cfg(any(target_os = "linux", target_os = "android"))]
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A reader thread that panicked leaves consistent bytes behind; use them.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(crate) fn result_pipe() -> Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub(crate) fn result_pipe() -> Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let (r, w) = nix::unistd::pipe()?;
    fcntl(&r, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    fcntl(&w, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok((r, w))
}

/// Blocks until `pid` has exited, leaving it unreaped (`WNOWAIT`).
pub(crate) fn wait_exited_no_reap(pid: i32) {
    loop {
        // SAFETY: siginfo_t is plain data; waitid only writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

pub(crate) fn kill_group(pgid: i32) {
    match killpg(Pid::from_raw(pgid), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        // EPERM: a member changed credentials; nothing more we can do from here.
        Err(e) => tracing::warn!(pgid, error = %e, "cannot kill the harness process group"),
    }
}

pub(crate) fn spawn_tail_reader(
    mut src: impl Read + Send + 'static,
    tail: Arc<Mutex<TailBuffer>>,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match src.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => lock(&tail).push(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = done.send(());
    });
}

/// Reads `src` to its end into `buf`, keeping at most `limit` bytes (the rest is drained so the
/// writer never blocks).
fn read_bounded(mut src: impl Read, buf: &Mutex<Vec<u8>>, limit: usize) {
    let mut chunk = [0u8; 65536];
    loop {
        match src.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                let mut b = lock(buf);
                let room = limit.saturating_sub(b.len());
                b.extend_from_slice(&chunk[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

/// Keeps the last `cap` bytes written to it and counts what it dropped.
#[derive(Debug)]
pub(crate) struct TailBuffer {
    cap: usize,
    data: std::collections::VecDeque<u8>,
    dropped: u64,
}

impl TailBuffer {
    pub(crate) fn new(cap: usize) -> Self {
        TailBuffer {
            cap,
            data: std::collections::VecDeque::new(),
            dropped: 0,
        }
    }

    /// Forgets what it holds (a persistent judge's tail starts afresh with each request).
    pub(crate) fn clear(&mut self) {
        self.data.clear();
        self.dropped = 0;
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let bytes = if bytes.len() > self.cap {
            self.dropped += (bytes.len() - self.cap) as u64;
            &bytes[bytes.len() - self.cap..]
        } else {
            bytes
        };
        let overflow = (self.data.len() + bytes.len()).saturating_sub(self.cap);
        self.data.drain(..overflow);
        self.dropped += overflow as u64;
        self.data.extend(bytes);
    }

    pub(crate) fn text(&self) -> String {
        let (a, b) = self.data.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        let text = String::from_utf8_lossy(&bytes);
        if self.dropped > 0 {
            format!("[… {} earlier bytes dropped]\n{text}", self.dropped)
        } else {
            text.into_owned()
        }
    }
}

/// The last `max` bytes of `text`, cut at a character boundary.
pub(crate) fn tail_of(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[…]{}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_buffer_keeps_the_end_and_counts_the_rest() {
        let mut t = TailBuffer::new(8);
        t.push(b"abcdef");
        t.push(b"ghij");
        assert_eq!(t.text(), "[… 2 earlier bytes dropped]\ncdefghij");
        t.push(b"0123456789xyz");
        assert_eq!(t.text(), "[… 15 earlier bytes dropped]\n56789xyz");
        let mut small = TailBuffer::new(100);
        small.push(b"ok");
        assert_eq!(small.text(), "ok");
    }

    #[test]
    fn scrubbed_environment_drops_secrets_and_keeps_knobs() {
        let parent = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("OPENAI_API_KEY", "sk-secret"),
            ("ANTHROPIC_API_KEY", "secret"),
            ("KSEARCH_SECRET_SEED", "42"),
            ("KSEARCH_HARNESS_FLUSH", "0"),
            ("PYTHONPATH", "/site/extra"),
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("KSEARCH_CUDA_ARCH", "sm_90a"),
            ("KSEARCH_HARNESS_CUDA_ARCH", "90a"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let knobs = vec![("KSEARCH_HARNESS_MODE".to_string(), "x".to_string())];
        let env = child_env(Path::new("/h"), &knobs, parent.into_iter());
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("PATH").as_deref(), Some("/usr/bin"));
        assert_eq!(get("CUDA_VISIBLE_DEVICES").as_deref(), Some("1"));
        assert_eq!(get("KSEARCH_CUDA_ARCH").as_deref(), Some("sm_90a"));
        assert_eq!(get("KSEARCH_HARNESS_CUDA_ARCH").as_deref(), Some("90a"));
        assert_eq!(get("KSEARCH_HARNESS_FLUSH").as_deref(), Some("0"));
        assert_eq!(get("KSEARCH_HARNESS_MODE").as_deref(), Some("x"));
        assert_eq!(get("PYTHONPATH").as_deref(), Some("/h:/site/extra"));
        assert_eq!(get("OPENAI_API_KEY"), None);
        assert_eq!(get("ANTHROPIC_API_KEY"), None);
        assert_eq!(get("KSEARCH_SECRET_SEED"), None);
    }

    #[test]
    fn tail_of_cuts_at_char_boundaries() {
        assert_eq!(tail_of("abc", 10), "abc");
        assert_eq!(tail_of("aµµ", 3), "[…]µ");
    }
}
