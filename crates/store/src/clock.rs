//! UTC timestamps without a date-time dependency: the store only ever needs "now" rendered two
//! ways (run ids and RFC 3339 stamps), both in UTC, and its own RFC 3339 stamps read back (for
//! the time a run took).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A broken-down UTC instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Utc {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub millis: u32,
}

impl Utc {
    pub fn now() -> Utc {
        // A clock before 1970 is a misconfigured machine; clamping to the epoch keeps ids valid.
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Utc::from_unix_millis(d.as_millis() as i64)
    }

    pub fn from_unix_millis(ms: i64) -> Utc {
        let secs = ms.div_euclid(1000);
        let millis = ms.rem_euclid(1000) as u32;
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Utc {
            year,
            month,
            day,
            hour: (sod / 3600) as u32,
            minute: (sod % 3600 / 60) as u32,
            second: (sod % 60) as u32,
            millis,
        }
    }

    /// `2026-11-30T09:15:00.123Z`; fixed width, so text order is time order.
    pub fn rfc3339(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second, self.millis
        )
    }

    /// `20261130-091500`: the readable, sortable prefix of a run id.
    pub fn id_stamp(&self) -> String {
        format!(
            "{:04}{:02}{:02}-{:02}{:02}{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

pub(crate) fn now_rfc3339() -> String {
    Utc::now().rfc3339()
}

/// Milliseconds since 1970-01-01 UTC of a stamp as the store writes it
/// (`2026-11-30T09:15:00.123Z`; the fraction may be missing or of any length). Anything else,
/// including an offset other than `Z`, is `None`: every stamp in a run store is UTC.
pub fn timestamp_millis(stamp: &str) -> Option<i64> {
    let s = stamp.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let year: i64 = digits(d.next()?, 4)?;
    let month = digits(d.next()?, 2)?;
    let day = digits(d.next()?, 2)?;
    let (hms, frac) = match time.split_once('.') {
        Some((hms, frac)) => (hms, Some(frac)),
        None => (time, None),
    };
    let mut t = hms.splitn(3, ':');
    let hour = digits(t.next()?, 2)?;
    let minute = digits(t.next()?, 2)?;
    let second = digits(t.next()?, 2)?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // A leap second (:60) is accepted as the next second's start.
    if second > 60 {
        return None;
    }
    let millis = match frac {
        None => 0,
        Some(f) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => f
            .bytes()
            .chain(std::iter::repeat(b'0'))
            .take(3)
            .fold(0, |acc, b| acc * 10 + i64::from(b - b'0')),
        Some(_) => return None,
    };
    let days = days_from_civil(year, month as u32, day as u32);
    Some(((days * 86_400 + hour * 3600 + minute * 60 + second) * 1000) + millis)
}

/// `s` as a number if it is exactly `len` ASCII digits.
fn digits(s: &str, len: usize) -> Option<i64> {
    if s.len() == len && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

/// The inverse of [`civil_from_days`]: days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400); // 0..=399
    let mp = i64::from(if month > 2 { month - 3 } else { month + 9 }); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day), using 400-year eras so
/// the arithmetic stays exact for any i64 day count we can meet.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468; // shift the epoch to 0000-03-01 so leap days end each year
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the March-based year
    let mp = (5 * doy + 2) / 153; // March = 0
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Four hex digits that differ between runs created in the same second, even in one process.
pub(crate) fn id_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut h = blake3::Hasher::new();
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let bytes = h.finalize();
    format!("{:02x}{:02x}", bytes.as_bytes()[0], bytes.as_bytes()[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(
            Utc::from_unix_millis(0).rfc3339(),
            "1970-01-01T00:00:00.000Z"
        );
        // 2000-02-29 (a 400-year leap day) 12:34:56.789
        assert_eq!(
            Utc::from_unix_millis(951_827_696_789).rfc3339(),
            "2000-02-29T12:34:56.789Z"
        );
        // 2026-11-30 09:15:00
        let t = Utc::from_unix_millis(1_796_030_100_000);
        assert_eq!(t.id_stamp(), "20261130-091500");
        // 2100 is not a leap year: 2100-02-28 23:59:59 + 1 s is March 1st
        assert_eq!(
            Utc::from_unix_millis(4_107_542_400_000).rfc3339(),
            "2100-03-01T00:00:00.000Z"
        );
        assert_eq!(
            Utc::from_unix_millis(-1).rfc3339(),
            "1969-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn stamps_parse_back_to_their_instant() {
        for ms in [
            0,
            -1,
            951_827_696_789,
            1_796_030_100_000,
            4_107_542_400_000,
            1_796_030_100_123,
        ] {
            let stamp = Utc::from_unix_millis(ms).rfc3339();
            assert_eq!(timestamp_millis(&stamp), Some(ms), "{stamp}");
        }
        assert_eq!(
            timestamp_millis("2026-12-01T21:24:39Z"),
            Some(timestamp_millis("2026-12-01T21:24:39.000Z").unwrap())
        );
        assert_eq!(
            timestamp_millis("2026-12-01T21:24:39.5Z"),
            Some(timestamp_millis("2026-12-01T21:24:39.500Z").unwrap())
        );
        for bad in [
            "",
            "2026-12-01",
            "2026-12-01T21:24:39.157",
            "2026-12-01T21:24:39.157+01:00",
            "2026-13-01T21:24:39.157Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T21:24:39.Z",
            "2026-12-1T21:24:39Z",
            "２０２６-12-01T21:24:39Z",
        ] {
            assert_eq!(timestamp_millis(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn suffixes_differ_within_a_process() {
        let a: std::collections::HashSet<String> = (0..64).map(|_| id_suffix()).collect();
        // 64 draws from 65536 values: a handful of collisions at most, never all equal.
        assert!(a.len() > 50, "{a:?}");
        assert!(a.iter().all(|s| s.len() == 4));
    }
}
