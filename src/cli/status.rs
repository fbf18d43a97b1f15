//! `shinyctl status [APP] [--json | --wide]`: the documented table (with
//! `--wide`, more columns after it), the memory line under it, and a line
//! for anything a person must know.

use std::time::Duration;

use crate::home::Home;
use crate::sys::fmt::{duration, size, DurationStyle, SizeStyle};
use crate::wire::api_client::Client;
use crate::wire::{Role, StatusReport};

/// The columns, as documented.
const COLUMNS: [&str; 11] = ["NAME", "COPY", "ROLE", "PORT", "PID", "STATUS", "READY", "MEM", "SESSIONS", "CRASHES", "STARTED"];
/// The columns `--wide` adds after them, as `pm2 list` shows a process.
const WIDE: [&str; 4] = ["UPTIME", "CPU", "CPU-TIME", "MEM-LIMIT"];

/// Prints status, or its JSON; with `watch`, redraws it every second until
/// interrupted (a daemon that stops answering is shown, not fatal).
pub fn run(home: &Home, app: Option<&str>, json: bool, watch: bool, wide: bool) -> anyhow::Result<()> {
    let client = Client::new(home);
    if json {
        println!("{}", String::from_utf8_lossy(&client.status_json(app)?));
        return Ok(());
    }
    if !watch {
        print!("{}", render(&client.status(app)?, wide));
        return Ok(());
    }
    loop {
        let text = match client.status(app) {
            Ok(report) => render(&report, wide),
            Err(e) => format!("shinyctl: {e:#}\n"),
        };
        let now = crate::sys::fmt::local_rfc3339(crate::sys::clock::now_ms());
        // Home the cursor and clear the screen, then the table, as `watch` does.
        print!("\x1b[H\x1b[2JEvery 1s: shinyctl status{}    {now}\n\n{text}", app.map(|a| format!(" {a}")).unwrap_or_default());
        use std::io::Write;
        std::io::stdout().flush()?;
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Renders the report as people read it; `wide` adds [`WIDE`]'s columns.
pub fn render(report: &StatusReport, wide: bool) -> String {
    if report.apps.is_empty() {
        return "No apps yet. Start one with: shinyctl apply -f app.yaml\n".to_string();
    }
    let dash = |s: Option<String>| s.unwrap_or_else(|| "-".to_string());
    let header = COLUMNS.iter().chain(if wide { WIDE.as_slice() } else { &[] });
    let mut rows: Vec<Vec<String>> = vec![header.map(|c| c.to_string()).collect()];
    for app in &report.apps {
        // An app with no copy (stopped) still has its line: where it stands.
        if app.copies.is_empty() {
            let mut row: Vec<String> = [app.name.as_str(), "-", "-"].map(str::to_string).to_vec();
            row.extend([app.port.to_string(), "-".into(), app.state.clone(), "-".into(), "-".into(), "0".into(), "-".into(), "-".into()]);
            row.extend(std::iter::repeat_n("-".to_string(), if wide { WIDE.len() } else { 0 }));
            rows.push(row);
        }
        for c in &app.copies {
            let mut row = vec![
                app.name.clone(),
                c.copy.to_string(),
                dash(c.role.map(|r| r.as_str().to_string())),
                app.port.to_string(),
                dash(c.pid.map(|p| p.to_string())),
                c.status.clone(),
                if c.ready { "ready".into() } else { "-".into() },
                dash(c.mem_bytes.map(|b| size(b, SizeStyle::WholeMib))),
                c.sessions.to_string(),
                if c.crashes == 0 { "-".into() } else { c.crashes.to_string() },
                dash(c.started.clone()),
            ];
            if wide {
                row.extend([
                    dash(c.uptime_secs.map(|s| duration(Duration::from_secs(s), DurationStyle::Uptime))),
                    dash(c.cpu_percent.map(|p| format!("{p:.1}%"))),
                    dash(c.cpu_secs.map(|s| duration(Duration::try_from_secs_f64(s).unwrap_or_default(), DurationStyle::CpuTime))),
                    dash(c.memory_limit_bytes.map(|b| size(b, SizeStyle::WholeMib))),
                ]);
            }
            rows.push(row);
        }
    }
    let widths: Vec<usize> = (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}", w = widths[i] + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&memory_line(report));
    out.push('\n');
    let notes: Vec<&String> = report.apps.iter().flat_map(|a| a.notes.iter()).chain(&report.own_user).collect();
    if !notes.is_empty() {
        out.push('\n');
        for n in notes {
            out.push_str(n);
            out.push('\n');
        }
    }
    out
}

/// "Memory: 420M in 3 R processes (1 warm, 1 draining), plus 41M for the load balancer."
fn memory_line(report: &StatusReport) -> String {
    let copies = report.apps.iter().flat_map(|a| a.copies.iter()).filter(|c| c.pid.is_some());
    let (mut total, mut n, mut warm, mut draining) = (0u64, 0usize, 0usize, 0usize);
    for c in copies {
        total += c.mem_bytes.unwrap_or(0);
        n += 1;
        match c.role {
            Some(Role::Warm) => warm += 1,
            Some(Role::Draining) => draining += 1,
            _ => {}
        }
    }
    let mut parts = Vec::new();
    if warm > 0 {
        parts.push(format!("{warm} warm"));
    }
    if draining > 0 {
        parts.push(format!("{draining} draining"));
    }
    let mut line = format!("Memory: {} in {n} R {}", size(total, SizeStyle::WholeMib), if n == 1 { "process" } else { "processes" });
    if !parts.is_empty() {
        line.push_str(&format!(" ({})", parts.join(", ")));
    }
    // The zygote's share of the pages it shares with its claimed copies
    // (theirs is in their MEM): with it, the line is what R takes in all.
    let pool = report.pool.iter().flat_map(|p| &p.zygotes).map(|z| z.mem_bytes).sum::<u64>();
    if pool > 0 {
        line.push_str(&format!(", plus {} for the pool", size(pool, SizeStyle::WholeMib)));
    }
    match report.proxy_rss_bytes {
        Some(rss) => line.push_str(&format!(", plus {} for the load balancer.", size(rss, SizeStyle::WholeMib))),
        None => line.push_str("; the load balancer is not running."),
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AppStatus, CopyStatus};

    const M: u64 = 1 << 20;

    fn copy(copy: u32, role: Role, pid: u32, mem: u64, sessions: u64, started: &str) -> CopyStatus {
        CopyStatus {
            copy,
            role: Some(role),
            copy_port: 20000 + copy as u16,
            pid: Some(pid),
            status: "alive".into(),
            ready: true,
            mem_bytes: Some(mem * M),
            sessions,
            crashes: 0,
            started: Some(started.into()),
            outdated: false,
            log: String::new(),
            release: None,
            isolation: None,
            launcher_pid: None,
            ..Default::default()
        }
    }

    #[test]
    fn renders_the_table_of_staying_up() {
        let report = StatusReport {
            daemon_pid: 1,
            proxy_pid: Some(2),
            proxy_rss_bytes: Some(41 * M),
            apps: vec![AppStatus {
                name: "hello".into(),
                group: "default".into(),
                port: 8765,
                revision: 2,
                release: None,
                previous_release: None,
                not_listening: None,
                copies: vec![
                    copy(1, Role::Draining, 61429, 142, 2, "2026-10-27T10:00:01+02:00"),
                    copy(3, Role::Active, 61501, 140, 1, "2026-10-27T11:30:05+02:00"),
                    copy(4, Role::Warm, 61502, 138, 0, "2026-10-27T11:30:05+02:00"),
                ],
                notes: vec!["hello: copy 1 is draining with 2 sessions; it stops when they end, or in 15m at the latest.".into()],
                runs_as_root: None,
                uid: None,
                state: "running".into(),
                replicas: 1,
                manifest: String::new(),
                capacity: None,
            }],
            limits: None,
            own_user: None,
            pool: None,
        };
        let expected = "\
NAME   COPY  ROLE      PORT  PID    STATUS  READY  MEM   SESSIONS  CRASHES  STARTED
hello  1     draining  8765  61429  alive   ready  142M  2         -        2026-10-27T10:00:01+02:00
hello  3     active    8765  61501  alive   ready  140M  1         -        2026-10-27T11:30:05+02:00
hello  4     warm      8765  61502  alive   ready  138M  0         -        2026-10-27T11:30:05+02:00

Memory: 420M in 3 R processes (1 warm, 1 draining), plus 41M for the load balancer.

hello: copy 1 is draining with 2 sessions; it stops when they end, or in 15m at the latest.
";
        assert_eq!(render(&report, false), expected);
    }

    #[test]
    fn a_starting_copy_shows_dashes() {
        let mut c = copy(1, Role::Active, 7, 50, 0, "x");
        c.role = None;
        c.ready = false;
        c.crashes = 2;
        c.status = "crash-looping".into();
        let report = StatusReport {
            apps: vec![AppStatus { name: "a".into(), port: 1, copies: vec![c], ..Default::default() }],
            ..Default::default()
        };
        let text = render(&report, false);
        let row = text.lines().nth(1).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells, ["a", "1", "-", "1", "7", "crash-looping", "-", "50M", "0", "2", "x"]);
        assert!(text.contains("Memory: 50M in 1 R process; the load balancer is not running."));
    }

    #[test]
    fn the_memory_line_adds_the_pools_share() {
        let zygote = crate::wire::ZygoteReport { pid: 9, rss_bytes: 80 * M, mem_bytes: 22 * M, ready: true };
        let report = StatusReport {
            apps: vec![AppStatus { name: "a".into(), port: 1, copies: vec![copy(1, Role::Active, 7, 90, 0, "x")], ..Default::default() }],
            proxy_rss_bytes: Some(8 * M),
            pool: Some(crate::wire::PoolReport { on: true, zygotes: vec![zygote], ..Default::default() }),
            ..Default::default()
        };
        let text = render(&report, false);
        assert!(text.contains("Memory: 90M in 1 R process, plus 22M for the pool, plus 8M for the load balancer."), "{text}");
    }

    #[test]
    fn an_app_without_copies_has_a_line_that_says_where_it_stands() {
        let app = |name: &str, state: &str| AppStatus { name: name.into(), port: 8766, state: state.into(), ..Default::default() };
        let report = StatusReport { apps: vec![app("hello", "stopped")], ..Default::default() };
        for wide in [false, true] {
            let text = render(&report, wide);
            let cells: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
            assert_eq!(cells[..11], ["hello", "-", "-", "8766", "-", "stopped", "-", "-", "0", "-", "-"], "{text}");
            assert_eq!(cells.len(), text.lines().next().unwrap().split_whitespace().count(), "every column: {text}");
        }
    }

    #[test]
    fn wide_adds_uptime_cpu_and_the_memory_limit_after_the_documented_columns() {
        let mut c = copy(3, Role::Active, 61501, 140, 1, "2026-10-27T11:30:05+02:00");
        (c.uptime_secs, c.cpu_percent, c.cpu_secs, c.memory_limit_bytes) = (Some(3725), Some(12.5), Some(73.456), Some(512 * M));
        let mut asleep = copy(4, Role::Warm, 1, 0, 0, "");
        (asleep.role, asleep.pid, asleep.mem_bytes, asleep.started, asleep.ready) = (None, None, None, None, false);
        asleep.status = "asleep".into();
        let report = StatusReport {
            apps: vec![AppStatus { name: "hello".into(), port: 8765, copies: vec![c, asleep], ..Default::default() }],
            ..Default::default()
        };
        let text = render(&report, true);
        let cells = |n: usize| text.lines().nth(n).unwrap().split_whitespace().collect::<Vec<_>>();
        let header = cells(0);
        assert_eq!(header[..11], COLUMNS, "the documented columns first, unchanged:\n{text}");
        assert_eq!(header[11..], WIDE, "{text}");
        assert_eq!(cells(1)[11..], ["1h02m", "12.5%", "1:13.46", "512M"], "{text}");
        assert_eq!(cells(2)[10..], ["-", "-", "-", "-", "-"], "a copy asleep has none:\n{text}");
        assert!(!render(&report, false).contains("UPTIME"), "the default table keeps the documented columns");
    }
}
