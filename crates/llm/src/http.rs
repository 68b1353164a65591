//! The blocking HTTP transport shared by the `openai` and `anthropic` providers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::secret::redact_opt;
use crate::{LlmError, Secret};

/// Replies larger than this are refused rather than buffered.
const MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;

/// What came back from one POST.
pub(crate) struct HttpReply {
    pub status: u16,
    pub body: String,
    pub retry_after: Option<Duration>,
}

/// One connection pool per provider, with a connect timeout and a total
/// per-call timeout (connect + send + read).
pub(crate) struct HttpTransport {
    agent: ureq::Agent,
    provider: String,
    timeout: Duration,
}

impl HttpTransport {
    pub fn new(provider: &str, connect_timeout: Duration, timeout: Duration) -> Self {
        let config = ureq::Agent::config_builder()
            // Statuses are data here: the body carries the provider's message.
            .http_status_as_error(false)
            .timeout_connect(Some(connect_timeout))
            .timeout_global(Some(timeout))
            // A redirect could carry the key header to another host; a
            // misconfigured base URL should fail loudly instead.
            .max_redirects(0)
            .user_agent(concat!("ksearch-llm/", env!("CARGO_PKG_VERSION")))
            .build();
        HttpTransport {
            agent: ureq::Agent::new_with_config(config),
            provider: provider.to_string(),
            timeout,
        }
    }

    /// POSTs `body` as JSON. Transport failures become typed errors; any
    /// HTTP status is returned as data.
    pub fn post_json(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
        secret: Option<&Secret>,
    ) -> Result<HttpReply, LlmError> {
        let payload = serde_json::to_vec(body)
            .map_err(|e| LlmError::Config(format!("cannot encode request: {e}")))?;
        let mut req = self
            .agent
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = req
            .send(&payload[..])
            .map_err(|e| self.map_error(e, secret))?;
        let status = resp.status().as_u16();
        let retry_after = parse_retry_after(
            header_str(resp.headers(), "retry-after-ms"),
            header_str(resp.headers(), "retry-after"),
            SystemTime::now(),
        );
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_string()
            .map_err(|e| self.map_error(e, secret))?;
        Ok(HttpReply {
            status,
            body,
            retry_after,
        })
    }

    /// GETs `url` within `timeout` (connect included), for checks before a run: any HTTP
    /// status is returned as data, transport failures as typed errors.
    pub fn get(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        secret: Option<&Secret>,
        timeout: Duration,
    ) -> Result<HttpReply, LlmError> {
        let mut req = self
            .agent
            .get(url)
            .header("accept", "application/json")
            .config()
            .timeout_global(Some(timeout))
            .build();
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = req.call().map_err(|e| {
            let err = self.map_error(e, secret);
            match err {
                LlmError::Timeout { provider, .. } => LlmError::Timeout {
                    provider,
                    after: timeout,
                },
                other => other,
            }
        })?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_string()
            .unwrap_or_default();
        Ok(HttpReply {
            status,
            body,
            retry_after: None,
        })
    }

    fn map_error(&self, e: ureq::Error, secret: Option<&Secret>) -> LlmError {
        let provider = self.provider.clone();
        let message = redact_opt(secret, &e.to_string());
        match e {
            ureq::Error::Timeout(_) => LlmError::Timeout {
                provider,
                after: self.timeout,
            },
            ureq::Error::Io(ref io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                LlmError::Timeout {
                    provider,
                    after: self.timeout,
                }
            }
            ureq::Error::BodyExceedsLimit(_) => LlmError::Malformed { provider, message },
            ureq::Error::BadUri(_) | ureq::Error::InvalidProxyUrl | ureq::Error::Http(_) => {
                LlmError::Config(format!("{provider}: {message}"))
            }
            _ => LlmError::Connection { provider, message },
        }
    }
}

/// How long the check before a run may take (`ChatProvider::preflight`).
pub(crate) const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(8);

/// What a GET of a provider's model list says about calls to come: the key is refused
/// (401, 403) fails; anything else passes, since a compatible server may lack the endpoint
/// (404, 405) or be briefly unwell, which the first call's retries handle.
pub(crate) fn preflight_verdict(
    provider: &str,
    reply: &HttpReply,
    secret: Option<&Secret>,
    hint: Option<&str>,
) -> Result<(), LlmError> {
    match reply.status {
        401 | 403 => Err(status_error(provider, reply, secret, hint)),
        _ => Ok(()),
    }
}

/// The first `max_chars` characters of `text` on one line, for error messages.
pub(crate) fn snippet(text: &str, max_chars: usize) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max_chars + 1)
        .collect();
    if one_line.chars().count() > max_chars {
        let cut: String = one_line.chars().take(max_chars).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

/// The human part of an error body, in the shapes OpenAI, Anthropic, vLLM,
/// Ollama and FastAPI-style servers use.
pub(crate) fn extract_error_message(v: &serde_json::Value) -> Option<String> {
    let err = v.get("error");
    if let Some(obj) = err.filter(|e| e.is_object()) {
        let message = obj.get("message").and_then(|m| m.as_str());
        let kind = obj.get("type").and_then(|t| t.as_str());
        return match (kind, message) {
            (Some(k), Some(m)) => Some(format!("{k}: {m}")),
            (None, Some(m)) => Some(m.to_string()),
            (Some(k), None) => Some(k.to_string()),
            (None, None) => Some(obj.to_string()),
        };
    }
    if let Some(s) = err.and_then(|e| e.as_str()) {
        return Some(s.to_string());
    }
    if let Some(s) = v.get("message").and_then(|m| m.as_str()) {
        return Some(s.to_string());
    }
    v.get("detail").map(|d| match d.as_str() {
        Some(s) => s.to_string(),
        None => d.to_string(),
    })
}

/// Turns a non-2xx reply into [`LlmError::Http`] with the server's message.
pub(crate) fn status_error(
    provider: &str,
    reply: &HttpReply,
    secret: Option<&Secret>,
    hint: Option<&str>,
) -> LlmError {
    let parsed = serde_json::from_str::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| extract_error_message(&v));
    let mut message = match parsed {
        Some(m) => snippet(&m, 1000),
        None if reply.body.trim().is_empty() => "(empty body)".to_string(),
        None => snippet(&reply.body, 300),
    };
    if let Some(h) = hint {
        message.push_str(" (");
        message.push_str(h);
        message.push(')');
    }
    LlmError::Http {
        provider: provider.to_string(),
        status: reply.status,
        message: redact_opt(secret, &message),
        retry_after: reply.retry_after,
    }
}

fn header_str<'a>(headers: &'a ureq::http::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The wait a server asks for. `retry-after-ms` (OpenAI) is more precise and
/// wins; `retry-after` is delta-seconds or an HTTP date.
pub(crate) fn parse_retry_after(
    ms: Option<&str>,
    secs_or_date: Option<&str>,
    now: SystemTime,
) -> Option<Duration> {
    if let Some(ms) = ms.and_then(|v| v.trim().parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    let v = secs_or_date?.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = parse_http_date(v)?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the only date
/// form servers are required to send, into seconds since the Unix epoch.
fn parse_http_date(s: &str) -> Option<u64> {
    let rest = s.split_once(", ")?.1;
    let parts: Vec<&str> = rest.split(' ').collect();
    if parts.len() != 5 || parts[4] != "GMT" {
        return None;
    }
    let day: u64 = parts[0].parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[1])? as u64
        + 1;
    let year: i64 = parts[2].parse().ok()?;
    let hms: Vec<u64> = parts[3]
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if hms.len() != 3 || !(1..=31).contains(&day) || hms[0] > 23 || hms[1] > 59 || hms[2] > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    if days < 0 {
        return None;
    }
    Some(days as u64 * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2])
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// well-known algorithm).
fn days_from_civil(y: i64, m: u64, d: u64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = m as i64;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(
            parse_retry_after(None, Some("7"), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after(None, Some(" 1.5 "), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after(Some("250"), Some("7"), now),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            parse_retry_after(None, Some("Sun, 06 Nov 1994 08:50:07 GMT"), now),
            Some(Duration::from_secs(30))
        );
        // A date in the past means "now".
        assert_eq!(
            parse_retry_after(None, Some("Sun, 06 Nov 1994 08:00:00 GMT"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after(None, Some("soon"), now), None);
        assert_eq!(parse_retry_after(None, Some("-3"), now), None);
        assert_eq!(parse_retry_after(None, None, now), None);
    }

    #[test]
    fn error_messages_from_common_shapes() {
        let cases = [
            (
                r#"{"error":{"message":"bad key","type":"invalid_request_error"}}"#,
                "invalid_request_error: bad key",
            ),
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                "overloaded_error: Overloaded",
            ),
            (r#"{"error":"model 'x' not found"}"#, "model 'x' not found"),
            (r#"{"message":"nope"}"#, "nope"),
            (r#"{"detail":[{"loc":"x"}]}"#, r#"[{"loc":"x"}]"#),
        ];
        for (body, want) in cases {
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(extract_error_message(&v).as_deref(), Some(want));
        }
        assert_eq!(extract_error_message(&serde_json::json!({"ok": 1})), None);
        assert_eq!(snippet("ab\ncd", 10), "ab cd");
        assert_eq!(snippet("abcdef", 3), "abc…");
    }

    #[test]
    fn http_date_matches_known_epoch_seconds() {
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2028 12:00:00 GMT"),
            Some(1_835_438_400)
        );
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 PST"), None);
        assert_eq!(parse_http_date("06 Nov 1994"), None);
    }
}
