//! The `command` provider: the user's own program (an agent CLI, a script)
//! answers; the prompt goes to its stdin and its stdout is the reply.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::openai::secs;
use crate::types::estimate_tokens;
use crate::{ChatProvider, ChatRequest, ChatResponse, LlmError, Secret, Usage};

/// Stdout beyond this is dropped (the reply is cut there).
const MAX_STDOUT_BYTES: u64 = 64 * 1024 * 1024;
/// How much of stderr an error shows.
const STDERR_TAIL_CHARS: usize = 2000;

/// What the program reads on stdin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandInput {
    /// The prompt as plain text: the bare user message when the request is a
    /// single user message with no system prompt, otherwise every part under
    /// a `## SYSTEM` / `## USER` / `## ASSISTANT` heading.
    #[default]
    Text,
    /// The whole request as one JSON object (`system`, `messages`,
    /// `max_tokens`, `temperature`, `seed`, `role_tag`).
    Json,
}

/// Settings of the `command` provider.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandConfig {
    /// Program and arguments; run directly, never through a shell.
    pub argv: Vec<String>,
    pub input: CommandInput,
    /// The program (and everything it started) is killed after this long.
    pub timeout_s: f64,
    /// Reported as the model (and used for price lookups).
    pub model: String,
    pub name: String,
    /// Working directory; the caller's when unset.
    pub cwd: Option<PathBuf>,
    /// Environment variables whose values are masked in the stderr tail of
    /// errors, in case the program prints its own credentials.
    pub redact_env: Vec<String>,
}

impl Default for CommandConfig {
    fn default() -> Self {
        CommandConfig {
            argv: Vec::new(),
            input: CommandInput::Text,
            timeout_s: 600.0,
            model: "command".to_string(),
            name: "command".to_string(),
            cwd: None,
            redact_env: vec!["OPENAI_API_KEY".into(), "ANTHROPIC_API_KEY".into()],
        }
    }
}

#[derive(Debug)]
pub struct CommandProvider {
    cfg: CommandConfig,
    timeout: Duration,
}

impl CommandProvider {
    pub fn new(cfg: CommandConfig) -> Result<Self, LlmError> {
        if cfg.argv.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(LlmError::Config(format!(
                "{}: argv must name a program",
                cfg.name
            )));
        }
        let timeout = secs(cfg.timeout_s, "timeout_s", &cfg.name)?;
        Ok(CommandProvider { cfg, timeout })
    }

    /// The bytes written to the program's stdin for `req`.
    pub fn render_input(&self, req: &ChatRequest) -> String {
        match self.cfg.input {
            CommandInput::Json => serde_json::to_string(req).unwrap_or_default(),
            CommandInput::Text => {
                if req.system.is_none() && req.messages.len() == 1 {
                    if let Some(m) = req.messages.first() {
                        if m.role == crate::Role::User {
                            return m.content.clone();
                        }
                    }
                }
                let mut out = String::new();
                if let Some(s) = &req.system {
                    out.push_str("## SYSTEM\n");
                    out.push_str(s);
                    out.push_str("\n\n");
                }
                for m in &req.messages {
                    out.push_str("## ");
                    out.push_str(&m.role.as_str().to_uppercase());
                    out.push('\n');
                    out.push_str(&m.content);
                    out.push_str("\n\n");
                }
                out
            }
        }
    }

    fn program(&self) -> &str {
        self.cfg.argv.first().map_or("", String::as_str)
    }

    fn redact(&self, text: &str) -> String {
        self.cfg
            .redact_env
            .iter()
            .filter_map(|v| Secret::from_env(v))
            .fold(text.to_string(), |t, s| s.redact(&t))
    }
}

impl ChatProvider for CommandProvider {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn model(&self) -> &str {
        &self.cfg.model
    }

    /// The program exists and may be executed (a path, or a name found on `PATH`, resolved
    /// as `Command` would, from the configured working directory).
    fn preflight(&self) -> Result<(), LlmError> {
        let program = self.program();
        let found = if program.contains('/') {
            let path = match &self.cfg.cwd {
                Some(dir) => dir.join(program),
                None => PathBuf::from(program),
            };
            is_executable(&path)
        } else {
            std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| is_executable(&dir.join(program)))
            })
        };
        if found {
            Ok(())
        } else {
            Err(LlmError::Config(format!(
                "{}: command `{program}` is not an executable file{}",
                self.cfg.name,
                if program.contains('/') {
                    ""
                } else {
                    " on PATH"
                }
            )))
        }
    }

    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let start = Instant::now();
        let input = self.render_input(req);
        let mut cmd = Command::new(self.program());
        cmd.args(&self.cfg.argv[1..])
            .env("KSEARCH_ROLE", &req.role_tag)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &self.cfg.cwd {
            cmd.current_dir(dir);
        }
        #[cfg(unix)]
        {
            // Own process group, so a timeout also kills whatever the agent
            // started (shells, compilers, sub-agents).
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| LlmError::io(format!("starting command `{}`", self.program()), e))?;

        let (tx, rx) = mpsc::channel::<(bool, Vec<u8>)>();
        spawn_reader(child.stdout.take(), true, MAX_STDOUT_BYTES, tx.clone());
        spawn_reader(child.stderr.take(), false, MAX_STDOUT_BYTES, tx);
        if let Some(mut stdin) = child.stdin.take() {
            // A separate writer: a program that answers before reading all of
            // a long prompt must not deadlock against us.
            thread::spawn(move || {
                // A program that exits without reading its stdin (`false`, a crash) makes this
                // write raise SIGPIPE, which kills the whole process where the CLI restores its
                // default action. Blocked in this thread, the write fails with EPIPE instead,
                // and the signal left pending on the thread goes with it.
                block_sigpipe_in_this_thread();
                let _ = stdin.write_all(input.as_bytes());
            });
        }

        let status = match wait_with_deadline(&mut child, start + self.timeout) {
            Some(status) => status,
            None => {
                kill_tree(&mut child);
                return Err(LlmError::Timeout {
                    provider: self.cfg.name.clone(),
                    after: self.timeout,
                });
            }
        };
        // The pipes close once every process holding them exits; a detached
        // grandchild could keep them open, so the wait is bounded.
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let drain_deadline = Instant::now() + Duration::from_secs(5);
        for _ in 0..2 {
            let left = drain_deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((true, b)) => stdout = b,
                Ok((false, b)) => stderr = b,
                Err(_) => break,
            }
        }
        let stderr = String::from_utf8_lossy(&stderr);
        if !status.success() {
            return Err(LlmError::CommandFailed {
                program: self.program().to_string(),
                status: status.to_string(),
                stderr_tail: self.redact(&tail(&stderr, STDERR_TAIL_CHARS)),
            });
        }
        let text = String::from_utf8_lossy(&stdout).into_owned();
        if text.trim().is_empty() {
            return Err(LlmError::EmptyReply {
                provider: self.cfg.name.clone(),
                detail: format!(
                    "`{}` printed nothing on stdout; stderr tail: {}",
                    self.program(),
                    self.redact(&tail(&stderr, 300))
                ),
            });
        }
        Ok(ChatResponse {
            usage: Usage {
                input_tokens: req.estimated_input_tokens(),
                output_tokens: estimate_tokens(text.chars().count()),
                estimated: true,
            },
            text,
            model: self.cfg.model.clone(),
            cost_usd: 0.0,
            latency_ms: start.elapsed().as_millis() as u64,
            cached: false,
            attempts: 1,
            stop_reason: None,
        })
    }
}

/// Blocks SIGPIPE for the calling thread only (SIGPIPE from a write is thread-directed).
fn is_executable(path: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

fn block_sigpipe_in_this_thread() {
    // SAFETY: plain libc calls on a local, zero-initialised signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

fn spawn_reader<R: Read + Send + 'static>(
    pipe: Option<R>,
    is_stdout: bool,
    limit: u64,
    tx: mpsc::Sender<(bool, Vec<u8>)>,
) {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(p) = pipe {
            let mut limited = p.take(limit);
            let _ = limited.read_to_end(&mut buf);
            // Keep draining so the program never blocks on a full pipe.
            let _ = std::io::copy(&mut limited.into_inner(), &mut std::io::sink());
        }
        let _ = tx.send((is_stdout, buf));
    });
}

fn wait_with_deadline(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            // The child cannot be observed any more; treat it like a hang.
            Err(_) => return None,
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn kill_tree(child: &mut Child) {
    #[cfg(unix)]
    {
        let pgid = child.id() as libc::pid_t;
        // SAFETY: kill(2) with a negative pid signals the process group we
        // created for this child; it touches no memory of ours.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn tail(text: &str, max_chars: usize) -> String {
    let trimmed = text.trim_end();
    let n = trimmed.chars().count();
    if n <= max_chars {
        trimmed.to_string()
    } else {
        let t: String = trimmed.chars().skip(n - max_chars).collect();
        format!("…{t}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    fn provider(input: CommandInput) -> CommandProvider {
        CommandProvider::new(CommandConfig {
            argv: vec!["cat".into()],
            input,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn text_input_is_bare_for_a_single_user_message() {
        let p = provider(CommandInput::Text);
        assert_eq!(
            p.render_input(&ChatRequest::new("c", "just this")),
            "just this"
        );
        let mut req = ChatRequest::new("c", "q").with_system("s");
        req.messages.push(Message::assistant("a"));
        assert_eq!(
            p.render_input(&req),
            "## SYSTEM\ns\n\n## USER\nq\n\n## ASSISTANT\na\n\n"
        );
    }

    #[test]
    fn json_input_round_trips() {
        let p = provider(CommandInput::Json);
        let req = ChatRequest::new("code", "x").with_seed(9);
        let back: ChatRequest = serde_json::from_str(&p.render_input(&req)).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn tail_keeps_the_end() {
        assert_eq!(tail("abc\n", 10), "abc");
        assert_eq!(tail("abcdef", 3), "…def");
    }

    #[test]
    fn empty_argv_is_a_config_error() {
        assert!(matches!(
            CommandProvider::new(CommandConfig::default()),
            Err(LlmError::Config(_))
        ));
    }
}
