//! Texts for people: sizes, durations and dates (through `jiff`, in the
//! local time zone). One formatter for each; where the program writes one
//! thing two ways on purpose (`142M` in status's table, `1.2 MiB` in a
//! sentence, `2.1G` the way a manifest writes it), that is a style of the
//! one formatter.

use std::time::Duration;

use jiff::tz::{Offset, TimeZone};
use jiff::Timestamp;

// ---------------------------------------------------------------------------
// What an app wrote, shown to the operator
// ---------------------------------------------------------------------------

/// `text` with every control character but the tab written out (`\x1b`,
/// `\u{9b}`), so what an app wrote to its log can neither clear the
/// operator's screen, set the terminal's title nor hide what follows it
/// (as journalctl shows such bytes). Unchanged when there is none.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' => out.push(c),
            c if c.is_control() && (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

// ---------------------------------------------------------------------------
// Sizes
// ---------------------------------------------------------------------------

/// How [`size`] writes a number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeStyle {
    /// The way a manifest writes a size, so a limit reads as it was set:
    /// `2G`, `2.1G`, `512M`, `1.5K`, `100B` (one decimal, dropped when 0).
    Manifest,
    /// In a sentence, with binary units: `100 B`, `2.9 KiB`, `1.2 MiB`,
    /// `2.0 GiB` (release sizes).
    Prose,
    /// Whole MiB rounded to the nearest, with an `M`: `142M` (status's MEM
    /// and memory line). Anything above 0 but under half a MiB shows `1M`
    /// (a process is never shown as using nothing); 0 shows `0M`; large
    /// values stay in M (`10240M`).
    WholeMib,
}

/// `bytes` over its largest binary unit of at least one (K, M, G or T, as
/// the index 1..=4 of [`UNITS`]); `None` under 1 KiB.
fn scaled(bytes: u64) -> Option<(f64, usize)> {
    let unit = (1..=4).rev().find(|&i| bytes >= 1u64 << (10 * i))?;
    Some((bytes as f64 / (1u64 << (10 * unit)) as f64, unit))
}

/// The binary units' letters, by power of 1024.
const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];

/// A number of bytes for people, in one of the [`SizeStyle`]s.
pub fn size(bytes: u64, style: SizeStyle) -> String {
    match (style, scaled(bytes)) {
        (SizeStyle::Manifest, None) => format!("{bytes}B"),
        (SizeStyle::Manifest, Some((v, unit))) => {
            let shown = format!("{:.1}", (v * 10.0).round() / 10.0);
            format!("{}{}", shown.strip_suffix(".0").unwrap_or(&shown), UNITS[unit])
        }
        (SizeStyle::Prose, None) => format!("{bytes} B"),
        (SizeStyle::Prose, Some((v, unit))) => format!("{v:.1} {}iB", UNITS[unit]),
        (SizeStyle::WholeMib, _) => {
            const MIB: u64 = 1 << 20;
            let mib = if bytes == 0 { 0 } else { ((bytes / MIB) + u64::from(bytes % MIB >= MIB / 2)).max(1) };
            format!("{mib}M")
        }
    }
}

// ---------------------------------------------------------------------------
// Durations
// ---------------------------------------------------------------------------

/// How [`duration`] writes a span of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationStyle {
    /// Rounded up to the second, in the units a manifest writes: `45s`,
    /// `1m30s`, `15m`, `1h`, `2h5m` (timeouts, waits, how long something
    /// has been so).
    Span,
    /// How long one step took: `under 1 ms`, `15 ms`, `1.2 s`.
    Took,
    /// As `pm2 list` writes an uptime, in its two largest units: `42s`,
    /// `5m12s`, `3h04m`, `2d07h` (status's UPTIME).
    Uptime,
    /// As `ps` writes CPU time, minutes and seconds: `0:03.41`, `72:10.00`
    /// (status's CPU time).
    CpuTime,
}

/// A span of time for people, in one of the [`DurationStyle`]s.
pub fn duration(d: Duration, style: DurationStyle) -> String {
    match style {
        DurationStyle::Span => {
            let s = d.as_millis().div_ceil(1000);
            match (s / 3600, (s % 3600) / 60, s % 60) {
                (0, 0, s) => format!("{s}s"),
                (0, m, 0) => format!("{m}m"),
                (0, m, s) => format!("{m}m{s}s"),
                (h, 0, _) => format!("{h}h"),
                (h, m, _) => format!("{h}h{m}m"),
            }
        }
        DurationStyle::Took => match d.as_millis() {
            0 => "under 1 ms".to_string(),
            ms if ms < 1000 => format!("{ms} ms"),
            ms => format!("{:.1} s", ms as f64 / 1000.0),
        },
        DurationStyle::Uptime => match d.as_secs() {
            s if s < 60 => format!("{s}s"),
            s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
            s if s < 86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
            s => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
        },
        DurationStyle::CpuTime => {
            let hundredths = (d.as_secs_f64() * 100.0).round() as u64;
            format!("{}:{:02}.{:02}", hundredths / 6000, hundredths / 100 % 60, hundredths % 100)
        }
    }
}

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

    const MIB: u64 = 1 << 20;

    #[test]
    fn sizes_the_way_a_manifest_writes_them() {
        let show = |b| size(b, SizeStyle::Manifest);
        assert_eq!(show(2 << 30), "2G");
        assert_eq!(show((2.1 * (1u64 << 30) as f64) as u64), "2.1G");
        assert_eq!(show(512 << 20), "512M");
        assert_eq!(show(200 << 20), "200M");
        assert_eq!(show(1500), "1.5K");
        assert_eq!(show(100), "100B");
        assert_eq!(show(3 << 40), "3T");
        assert_eq!(show(5000 << 40), "5000T", "T is the largest unit");
    }

    #[test]
    fn sizes_in_prose() {
        let show = |b| size(b, SizeStyle::Prose);
        assert_eq!(show(1000), "1000 B");
        assert_eq!(show(3000), "2.9 KiB");
        assert_eq!(show(100 << 20), "100.0 MiB");
        assert_eq!(show(2 << 30), "2.0 GiB");
        assert_eq!(show(2048 << 40), "2048.0 TiB");
    }

    #[test]
    fn sizes_in_whole_mib() {
        let show = |b| size(b, SizeStyle::WholeMib);
        assert_eq!(show(0), "0M");
        assert_eq!(show(1), "1M");
        assert_eq!(show(MIB / 3), "1M");
        assert_eq!(show(MIB), "1M");
        assert_eq!(show(142 * MIB), "142M");
        assert_eq!(show(142 * MIB + MIB / 2), "143M");
        assert_eq!(show(142 * MIB + MIB / 2 - 1), "142M");
        assert_eq!(show(10 * 1024 * MIB), "10240M");
    }

    #[test]
    fn spans() {
        let show = |ms| duration(Duration::from_millis(ms), DurationStyle::Span);
        assert_eq!(show(15 * 60_000), "15m");
        assert_eq!(show(45_000), "45s");
        assert_eq!(show(90_000), "1m30s");
        assert_eq!(show(3_600_000), "1h");
        assert_eq!(show(3_600_000 + 5 * 60_000 + 7_000), "1h5m");
        assert_eq!(show(1), "1s", "rounded up");
        assert_eq!(show(0), "0s");
    }

    #[test]
    fn how_long_a_step_took() {
        let show = |ms| duration(Duration::from_millis(ms), DurationStyle::Took);
        assert_eq!(show(0), "under 1 ms");
        assert_eq!(show(15), "15 ms");
        assert_eq!(show(1234), "1.2 s");
    }

    #[test]
    fn uptimes_and_cpu_times() {
        let up = |s| duration(Duration::from_secs(s), DurationStyle::Uptime);
        assert_eq!((up(42), up(312), up(3720), up(2 * 86_400 + 7 * 3600)), ("42s".into(), "5m12s".into(), "1h02m".into(), "2d07h".into()));
        let cpu = |s| duration(Duration::from_secs_f64(s), DurationStyle::CpuTime);
        assert_eq!(cpu(3.414), "0:03.41");
        assert_eq!(cpu(73.456), "1:13.46");
        assert_eq!(cpu(72.0 * 60.0), "72:00.00");
    }

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
            .args(["sys::fmt::tests::local_time_in_india", "--exact", "--ignored", "--test-threads=1"])
            .env("TZ", "Asia/Kolkata")
            .output()
            .expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn what_an_app_wrote_cannot_drive_the_terminal() {
        assert!(matches!(printable("Error: plain\ttext é"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            printable("Error: \x1b]0;PWNED\x07\x1b[2J\x1b[8m\u{9b}31m\r"),
            "Error: \\x1b]0;PWNED\\x07\\x1b[2J\\x1b[8m\\u{9b}31m\\x0d"
        );
    }
}
