//! Which text a metrics scrape gets: OpenMetrics 1.0 (what
//! `prometheus-client` writes, and the answer unless the scraper prefers
//! otherwise), or Prometheus's classic text format 0.0.4 for a scraper that
//! asks for `text/plain` (older Prometheus servers, Telegraf, Datadog,
//! hand-written scripts). The two differ, for what the metrics here use,
//! only in their comment lines: 0.0.4 has no `# UNIT` and no `# EOF`, and a
//! counter's `# HELP`/`# TYPE` name the sample, `_total` included.

/// The two formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0.
    OpenMetrics,
    /// Prometheus text 0.0.4.
    Classic,
}

impl Format {
    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The format an `Accept` header asks for: classic when it rates
/// `text/plain` above `application/openmetrics-text` (or lists only the
/// former); OpenMetrics otherwise, and with no header.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else { return Format::OpenMetrics };
    let (mut open, mut text) = (None::<f64>, None::<f64>);
    for range in accept.split(',') {
        let mut params = range.split(';').map(str::trim);
        let kind = params.next().unwrap_or("").to_ascii_lowercase();
        let q = params.filter_map(|p| p.strip_prefix("q=")).find_map(|q| q.parse::<f64>().ok()).unwrap_or(1.0);
        let slot = match kind.as_str() {
            "application/openmetrics-text" => &mut open,
            "text/plain" => &mut text,
            _ => continue,
        };
        *slot = Some(slot.map_or(q, |was| was.max(q)));
    }
    match (open, text) {
        (None, Some(t)) if t > 0.0 => Format::Classic,
        (Some(o), Some(t)) if t > o => Format::Classic,
        _ => Format::OpenMetrics,
    }
}

/// OpenMetrics text as `prometheus-client` writes it, turned into the
/// classic format: `# EOF` and `# UNIT` lines dropped, and the `# HELP`
/// and `# TYPE` lines of a counter family named as its samples are
/// (`shinyctl_restarts` → `shinyctl_restarts_total`). Sample lines are the
/// same in both for what is written here: no exemplars, no `_created`.
pub fn to_classic(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        open_metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(open_metrics.len());
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let comment = ["# HELP ", "# TYPE "].into_iter().find(|p| line.starts_with(p));
        match comment.map(|p| (p, &line[p.len()..])) {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let sep = if tail.is_empty() && prefix == "# HELP " { "" } else { " " };
                let total = if counters.contains(name) { "_total" } else { "" };
                out.push_str(&format!("{prefix}{name}{total}{sep}{tail}"));
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scraper_that_prefers_text_plain_gets_the_classic_format() {
        assert_eq!(negotiate(None), Format::OpenMetrics);
        assert_eq!(negotiate(Some("*/*")), Format::OpenMetrics);
        assert_eq!(negotiate(Some("text/plain;version=0.0.4")), Format::Classic);
        assert_eq!(negotiate(Some("text/plain; version=0.0.4; charset=utf-8, */*;q=0.1")), Format::Classic);
        // What Prometheus itself sends: OpenMetrics first.
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(negotiate(Some("application/openmetrics-text;q=0.2, text/plain;q=0.9")), Format::Classic);
        assert_eq!(negotiate(Some("text/plain;q=0")), Format::OpenMetrics);
    }

    #[test]
    fn counters_are_named_by_their_samples_and_units_and_eof_go() {
        let open = "\
# HELP shinyctl_restarts Copies started again, by reason.
# TYPE shinyctl_restarts counter
shinyctl_restarts_total{app=\"web\",reason=\"crash\"} 1
# HELP shinyctl_received_bytes Bytes read.
# TYPE shinyctl_received_bytes counter
# UNIT shinyctl_received_bytes bytes
shinyctl_received_bytes_total{app=\"web\"} 500
# HELP shinyctl_copy_ready 1 when ready.
# TYPE shinyctl_copy_ready gauge
shinyctl_copy_ready{app=\"web\",copy=\"1\"} 1
# HELP shinyctl_wake_duration_seconds Wake.
# TYPE shinyctl_wake_duration_seconds histogram
# UNIT shinyctl_wake_duration_seconds seconds
shinyctl_wake_duration_seconds_sum{app=\"web\"} 0.0
shinyctl_wake_duration_seconds_count{app=\"web\"} 0
shinyctl_wake_duration_seconds_bucket{le=\"+Inf\",app=\"web\"} 0
# EOF
";
        let classic = "\
# HELP shinyctl_restarts_total Copies started again, by reason.
# TYPE shinyctl_restarts_total counter
shinyctl_restarts_total{app=\"web\",reason=\"crash\"} 1
# HELP shinyctl_received_bytes_total Bytes read.
# TYPE shinyctl_received_bytes_total counter
shinyctl_received_bytes_total{app=\"web\"} 500
# HELP shinyctl_copy_ready 1 when ready.
# TYPE shinyctl_copy_ready gauge
shinyctl_copy_ready{app=\"web\",copy=\"1\"} 1
# HELP shinyctl_wake_duration_seconds Wake.
# TYPE shinyctl_wake_duration_seconds histogram
shinyctl_wake_duration_seconds_sum{app=\"web\"} 0.0
shinyctl_wake_duration_seconds_count{app=\"web\"} 0
shinyctl_wake_duration_seconds_bucket{le=\"+Inf\",app=\"web\"} 0
";
        assert_eq!(to_classic(open), classic);
    }
}
