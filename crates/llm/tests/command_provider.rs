//! The `command` provider with small shell scripts.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ksearch_llm::{
    ChatProvider, ChatRequest, Client, ClientConfig, CommandConfig, CommandInput, CommandProvider,
    LlmError, PriceTable, RetryPolicy,
};

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn provider(argv: Vec<String>, timeout_s: f64) -> CommandProvider {
    CommandProvider::new(CommandConfig {
        argv,
        timeout_s,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn prompt_on_stdin_reply_on_stdout_role_in_env() {
    let dir = tempfile::tempdir().unwrap();
    // Echo the role and the prompt upper-cased, so both paths are checked.
    let s = script(
        dir.path(),
        "agent.sh",
        r#"printf 'role=%s arg=%s\n' "$KSEARCH_ROLE" "$1"; tr a-z A-Z"#,
    );
    let p = provider(
        vec![s.display().to_string(), "--flag with space".into()],
        10.0,
    );
    let r = p
        .complete(&ChatRequest::new("wm-init", "make it fast"))
        .unwrap();
    assert_eq!(r.text, "role=wm-init arg=--flag with space\nMAKE IT FAST");
    assert!(r.usage.estimated);
    assert_eq!(r.usage.input_tokens, 3); // 12 characters
    assert_eq!(r.model, "command");
}

#[test]
fn json_input_mode_passes_the_whole_request() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(dir.path(), "cat.sh", "cat");
    let p = CommandProvider::new(CommandConfig {
        argv: vec![s.display().to_string()],
        input: CommandInput::Json,
        ..Default::default()
    })
    .unwrap();
    let req = ChatRequest::new("code", "x")
        .with_system("sys")
        .with_seed(5);
    let r = p.complete(&req).unwrap();
    let back: ChatRequest = serde_json::from_str(&r.text).unwrap();
    assert_eq!(back, req);
}

#[test]
fn large_prompts_do_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    // Writes 1 MB before reading its 2 MB of stdin: far beyond both pipe
    // buffers, so feeding stdin and draining stdout must happen at once.
    let s = script(
        dir.path(),
        "big.sh",
        "head -c 1048576 /dev/zero | tr '\\0' a; echo; wc -c",
    );
    let p = provider(vec![s.display().to_string()], 20.0);
    let prompt = "y".repeat(2 * 1024 * 1024);
    let r = p.complete(&ChatRequest::new("code", prompt)).unwrap();
    let lines: Vec<&str> = r.text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].len(), 1_048_576);
    assert!(lines[0].bytes().all(|b| b == b'a'));
    assert_eq!(lines[1].trim(), "2097152");
}

#[test]
fn non_zero_exit_is_an_error_with_the_stderr_tail() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        dir.path(),
        "fail.sh",
        "echo partial; echo 'line one' >&2; echo 'quota exceeded' >&2; exit 3",
    );
    let p = provider(vec![s.display().to_string()], 10.0);
    let err = p.complete(&ChatRequest::new("code", "x")).unwrap_err();
    match &err {
        LlmError::CommandFailed {
            status,
            stderr_tail,
            ..
        } => {
            assert!(status.contains('3'), "{status}");
            assert!(stderr_tail.ends_with("quota exceeded"), "{stderr_tail}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.is_retryable());
}

#[test]
fn empty_stdout_is_an_empty_reply() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(dir.path(), "quiet.sh", "cat >/dev/null; echo '   '");
    let p = provider(vec![s.display().to_string()], 10.0);
    let err = p.complete(&ChatRequest::new("code", "x")).unwrap_err();
    assert!(matches!(err, LlmError::EmptyReply { .. }), "{err:?}");
    assert!(err.is_retryable());
}

#[test]
fn timeout_kills_the_program_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("survived");
    // A background child that would write the marker after 1.5 s.
    let s = script(
        dir.path(),
        "hang.sh",
        &format!("(sleep 1.5; touch '{}') & sleep 30", marker.display()),
    );
    let p = provider(vec![s.display().to_string()], 0.5);
    let start = Instant::now();
    let err = p.complete(&ChatRequest::new("code", "x")).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, LlmError::Timeout { .. }), "{err:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    std::thread::sleep(Duration::from_millis(2000));
    assert!(!marker.exists(), "a child outlived the timeout");
}

#[test]
fn missing_program_is_an_io_error() {
    let p = provider(vec!["/nonexistent/ksearch-agent".into()], 5.0);
    let err = p.complete(&ChatRequest::new("code", "x")).unwrap_err();
    assert!(matches!(err, LlmError::Io { .. }), "{err:?}");
}

#[test]
fn client_retries_an_empty_reply_from_a_command() {
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("count");
    // Prints nothing on the first run, an answer on the second.
    let s = script(
        dir.path(),
        "flaky.sh",
        &format!(
            "cat >/dev/null; if [ -f '{c}' ]; then echo answer; else touch '{c}'; fi",
            c = counter.display()
        ),
    );
    let p: Arc<dyn ChatProvider> = Arc::new(provider(vec![s.display().to_string()], 10.0));
    let cfg = ClientConfig {
        retry: RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            ..Default::default()
        },
        prices: PriceTable::empty(),
        ..Default::default()
    };
    let client = Client::new(p, cfg).unwrap();
    let r = client.complete(&ChatRequest::new("code", "q")).unwrap();
    assert_eq!((r.text.trim(), r.attempts), ("answer", 2));
    assert_eq!(client.totals().unpriced_calls, 1);
}
