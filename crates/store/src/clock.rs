//! UTC timestamps without a date-time dependency: the store only ever needs "now" rendered two
//! ways (run ids and RFC 3339 stamps), both in UTC.

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
    fn suffixes_differ_within_a_process() {
        let a: std::collections::HashSet<String> = (0..64).map(|_| id_suffix()).collect();
        // 64 draws from 65536 values: a handful of collisions at most, never all equal.
        assert!(a.len() > 50, "{a:?}");
        assert!(a.iter().all(|s| s.len() == 4));
    }
}
