//! Texts for people: dates (through `jiff`, in the local time zone).

use jiff::tz::{Offset, TimeZone};
use jiff::Timestamp;

// ---------------------------------------------------------------------------
// Dates
// ---------------------------------------------------------------------------

/// `unix_ms` as a timestamp; one beyond jiff's range (year 9999) is
/// clamped to it, so no input makes a date fail.
fn timestamp(unix_ms: u64) -> Timestamp {
    let ms = i64::try_from(unix_ms).unwrap_or(i64::MAX);
    Timestamp::from_millisecond(ms).unwrap_or(Timestamp::MAX)
}

/// `unix_ms` as RFC 3339 in time zone `tz`, to the second (the
/// milliseconds are dropped, not rounded), with the offset always written
/// as `+HH:MM`/`-HH:MM` (never `Z`).
fn rfc3339_in(unix_ms: u64, tz: TimeZone) -> String {
    timestamp(unix_ms).to_zoned_datetime(tz).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
}

/// `unix_ms` as RFC 3339 at a fixed UTC offset, to the second, with the
/// offset always written as `+HH:MM`/`-HH:MM` (never `Z`):
/// `rfc3339_at_offset(0, 3600)` is `1970-01-01T01:00:00+01:00`. An offset
/// beyond ±25 hours is taken as UTC. Pure.
pub fn rfc3339_at_offset(unix_ms: u64, offset_secs: i64) -> String {
    let offset = i32::try_from(offset_secs).ok().and_then(|s| Offset::from_seconds(s).ok()).unwrap_or(Offset::UTC);
    rfc3339_in(unix_ms, TimeZone::fixed(offset))
}

/// The local time zone: `TZ` when set, else `/etc/localtime`, with rules
/// from `/usr/share/zoneinfo`; UTC when neither can be read.
fn local_zone() -> TimeZone {
    TimeZone::try_system().unwrap_or(TimeZone::UTC)
}

/// `unix_ms` as local time in RFC 3339 with its offset, to the second, like
/// `2026-10-27T10:00:01+02:00` (UTC is written `+00:00`, not `Z`): the
/// STARTED column of status, log lines, release lists.
pub fn local_rfc3339(unix_ms: u64) -> String {
    rfc3339_in(unix_ms, local_zone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formatting() {
        assert_eq!(rfc3339_at_offset(0, 0), "1970-01-01T00:00:00+00:00");
        assert_eq!(rfc3339_at_offset(0, 3600), "1970-01-01T01:00:00+01:00");
        // 2026-10-27T08:00:01Z
        let ms = 1_793_088_001_000 + 999;
        assert_eq!(rfc3339_at_offset(ms, 7200), "2026-10-27T10:00:01+02:00");
        assert_eq!(rfc3339_at_offset(ms, -(3 * 3600 + 1800)), "2026-10-27T04:30:01-03:30");
        assert_eq!(rfc3339_at_offset(951_782_400_000, 0), "2000-02-29T00:00:00+00:00");
        assert_eq!(rfc3339_at_offset(1_704_067_199_000, 0), "2023-12-31T23:59:59+00:00");
        assert_eq!(rfc3339_at_offset(u64::MAX, 0), "9999-12-30T22:00:00+00:00", "clamped, not a panic");
    }

    #[test]
    fn a_named_zone_follows_summer_time() {
        let berlin = TimeZone::get("Europe/Berlin").expect("Europe/Berlin in /usr/share/zoneinfo");
        // 2026-10-25T00:30:00Z, summer time; 02:30Z, after the clocks went back.
        assert_eq!(rfc3339_in(1_792_888_200_000, berlin.clone()), "2026-10-25T02:30:00+02:00");
        assert_eq!(rfc3339_in(1_792_895_400_000, berlin), "2026-10-25T03:30:00+01:00");
    }

    #[test]
    fn local_rfc3339_shape() {
        let ms = 1_793_088_001_000;
        let s = local_rfc3339(ms);
        let b = s.as_bytes();
        assert_eq!(s.len(), 25, "{s}");
        for (i, c) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':'), (22, b':')] {
            assert_eq!(b[i], c, "{s}");
        }
        assert!(b[19] == b'+' || b[19] == b'-', "{s}");
        assert!(!s.contains('Z'));
        for i in [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 23, 24] {
            assert!(b[i].is_ascii_digit(), "{s}");
        }
        let offset = local_zone().to_offset(timestamp(ms)).seconds();
        assert_eq!(s, rfc3339_at_offset(ms, i64::from(offset)));
    }

    /// Run by [`tz_is_honoured`] in a child with `TZ` set (the environment
    /// of this process is not the test's to change).
    #[test]
    #[ignore = "run by tz_is_honoured with TZ set"]
    fn local_time_in_india() {
        assert_eq!(std::env::var("TZ").as_deref(), Ok("Asia/Kolkata"));
        assert_eq!(local_rfc3339(0), "1970-01-01T05:30:00+05:30");
        assert_eq!(local_rfc3339(1_793_088_001_000), "2026-10-27T13:30:01+05:30");
    }

    #[test]
    fn tz_is_honoured() {
        let me = std::env::current_exe().expect("the test binary");
        let out = std::process::Command::new(me)
            .args(["fmt::tests::local_time_in_india", "--exact", "--ignored", "--test-threads=1"])
            .env("TZ", "Asia/Kolkata")
            .output()
            .expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    }
}
