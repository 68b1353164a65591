//! The one error type of the crate, and which errors are worth a retry.

use std::time::Duration;

/// Everything that can go wrong when asking a provider for a reply.
///
/// Messages never contain API keys: every text that came from a server or a
/// child process passes through [`crate::Secret::redact`] before it lands here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The server answered with a non-success HTTP status.
    #[error("{provider}: HTTP {status}: {message}")]
    Http {
        provider: String,
        status: u16,
        message: String,
        /// What the server asked us to wait (`Retry-After` / `retry-after-ms`).
        retry_after: Option<Duration>,
    },
    /// A success status whose body is an error object (some compatible servers do this).
    #[error("{provider}: API error: {message}")]
    Api {
        provider: String,
        message: String,
        retryable: bool,
    },
    /// The call (connect + read, or the child process) took longer than allowed.
    #[error("{provider}: no reply within {after:?}")]
    Timeout { provider: String, after: Duration },
    /// Could not reach the server, or the connection broke mid-reply.
    #[error("{provider}: connection failed: {message}")]
    Connection { provider: String, message: String },
    /// The reply could not be understood (not JSON, wrong shape, too large).
    #[error("{provider}: malformed reply: {message}")]
    Malformed { provider: String, message: String },
    /// The reply had no text in it (no choices, empty content, empty stdout).
    #[error("{provider}: empty reply: {detail}")]
    EmptyReply { provider: String, detail: String },
    /// The model declined to answer; asking again the same way will not help.
    #[error("{provider}: the model refused: {message}")]
    Refused { provider: String, message: String },
    /// The `command` provider's program exited unsuccessfully.
    #[error("command `{program}` failed ({status}); stderr tail: {stderr_tail}")]
    CommandFailed {
        program: String,
        status: String,
        stderr_tail: String,
    },
    /// The token or money budget does not allow this call.
    #[error("budget exhausted: {reason}")]
    BudgetExhausted { reason: String },
    /// A replay transcript cannot answer this request.
    #[error("replay: {message}")]
    Replay { message: String },
    /// Bad settings: missing key, bad URL, bad price table, empty argv, ...
    #[error("configuration: {0}")]
    Config(String),
    /// A local file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Every attempt failed with a retryable error; `last` is the final one.
    #[error("gave up after {attempts} attempts; last error: {last}")]
    GaveUp { attempts: u32, last: Box<LlmError> },
}

impl LlmError {
    /// Whether the same request may succeed if sent again after a pause.
    ///
    /// Rate limits, server errors, timeouts, broken connections and replies
    /// that were garbled or empty are transient; client errors (bad request,
    /// bad key, unknown model) and refusals are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Http { status, .. } => is_retryable_status(*status),
            LlmError::Api { retryable, .. } => *retryable,
            LlmError::Timeout { .. }
            | LlmError::Connection { .. }
            | LlmError::Malformed { .. }
            | LlmError::EmptyReply { .. } => true,
            LlmError::Refused { .. }
            | LlmError::CommandFailed { .. }
            | LlmError::BudgetExhausted { .. }
            | LlmError::Replay { .. }
            | LlmError::Config(_)
            | LlmError::Io { .. }
            | LlmError::GaveUp { .. } => false,
        }
    }

    /// The wait the server asked for, if it asked.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Http { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The error that ended the call, looking through [`LlmError::GaveUp`].
    pub fn last(&self) -> &LlmError {
        match self {
            LlmError::GaveUp { last, .. } => last.last(),
            other => other,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LlmError::Io {
            context: context.into(),
            source,
        }
    }
}

/// 408 (request timeout), 409 (conflict, used for transient lock errors),
/// 425 (too early), 429 (rate limit) and every 5xx (including Anthropic's 529
/// "overloaded") are worth another try.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 425 | 429) || (500..600).contains(&status)
}
