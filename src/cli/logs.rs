//! `shinyctl logs APP [--copy N] [--all] [-n N] [-f]`: the app's copies'
//! output, copy by copy in start order, each line prefixed with its copy
//! (README, "Logs"). `-f` interleaves lines as they are written and picks
//! up new copies (a redeploy, a restart after a crash) as they start.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use crate::home::Home;
use crate::wire::api_client::Client;
use crate::wire::CopyLogFile;

/// Lines per copy shown when `-n` is not given: about a screenful for one.
pub const DEFAULT_TAIL: usize = 20;
/// How often `-f` reads the logs; the copies are asked for each second.
const POLL: Duration = Duration::from_millis(200);

/// What to show.
#[derive(Debug, Clone, Copy)]
pub struct Choice {
    /// Only this copy.
    pub copy: Option<u32>,
    /// Also the copies that ended.
    pub all: bool,
    /// The last lines of each copy's log.
    pub tail: usize,
    /// Keep printing as the logs grow.
    pub follow: bool,
}

/// Prints the chosen copies' logs; with `follow`, keeps printing.
pub fn run(home: &Home, app: &str, choice: Choice) -> anyhow::Result<()> {
    let client = Client::new(home);
    let chosen = |files: Vec<CopyLogFile>| -> Vec<CopyLogFile> {
        files.into_iter().filter(|f| choice.copy.map_or(choice.all || f.live, |c| c == f.copy)).collect()
    };
    let files = chosen(client.logs(app)?.copies);
    if files.is_empty() {
        match choice.copy {
            Some(c) => anyhow::bail!("{app} has no log of copy {c}; `shinyctl logs {app} --all` shows every copy's"),
            None if !choice.follow => anyhow::bail!("{app} has no running copy; `shinyctl logs {app} --all` shows the copies that ended"),
            None => {}
        }
    }
    let mut out = Out { to: std::io::stdout().lock(), terminal: std::io::IsTerminal::is_terminal(&std::io::stdout()) };
    // Where each followed log was read to.
    let mut read_to: BTreeMap<u32, (String, u64)> = BTreeMap::new();
    for f in &files {
        let (lines, end) = last_lines(&f.path, choice.tail);
        for line in lines {
            out.line(f.copy, &line)?;
        }
        read_to.insert(f.copy, (f.path.clone(), end));
    }
    out.to.flush()?;
    if !choice.follow {
        return Ok(());
    }
    let mut asked = Instant::now();
    loop {
        std::thread::sleep(POLL);
        if asked.elapsed() >= Duration::from_secs(1) {
            asked = Instant::now();
            // New copies are followed from their first line. A daemon that
            // does not answer (an upgrade restarts it) is asked again; one
            // that no longer knows the app ends the follow, once what its
            // copies wrote last is printed.
            match client.logs(app) {
                Ok(reply) => {
                    for f in chosen(reply.copies) {
                        read_to.entry(f.copy).or_insert((f.path, 0));
                    }
                }
                Err(e) if crate::wire::api_client::is_not_found(&e) => {
                    print_new(&mut out, &mut read_to)?;
                    eprintln!("shinyctl: {app} is gone ({e}); its logs are no longer followed.");
                    return Ok(());
                }
                Err(_) => {}
            }
        }
        print_new(&mut out, &mut read_to)?;
    }
}

/// Prints what each followed log got since it was last read.
fn print_new(out: &mut Out<impl Write>, read_to: &mut BTreeMap<u32, (String, u64)>) -> std::io::Result<()> {
    for (copy, (path, pos)) in read_to.iter_mut() {
        for line in new_lines(path, pos) {
            out.line(*copy, &line)?;
        }
    }
    out.to.flush()
}

/// Where the lines go.
struct Out<W: Write> {
    /// Standard output.
    to: W,
    /// It is a terminal: what the app wrote is shown with its control
    /// characters written out (`crate::sys::fmt::printable`); into a pipe
    /// or a file it goes as written.
    terminal: bool,
}

impl<W: Write> Out<W> {
    /// One line, `copy 3 | ` before it.
    fn line(&mut self, copy: u32, line: &str) -> std::io::Result<()> {
        if self.terminal {
            writeln!(self.to, "copy {copy} | {}", crate::sys::fmt::printable(line))
        } else {
            writeln!(self.to, "copy {copy} | {line}")
        }
    }
}

/// The last `n` lines of a file, and its length (where following starts).
pub fn last_lines(path: &str, n: usize) -> (Vec<String>, u64) {
    let Ok(mut file) = std::fs::File::open(path) else { return (Vec::new(), 0) };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    // Read back from the end in blocks until n lines are in hand, so a log
    // of a gigabyte costs what its tail costs; and no further back than n
    // lines of the longest a copy writes (the launcher ends a line at
    // 64 KiB), so a huge line from before costs no more than that.
    let most = (n as u64 + 1) * (64 << 10) + (64 << 10);
    let mut start = len;
    let (mut blocks, mut newlines) = (Vec::new(), 0);
    while start > 0 && newlines <= n && len - start < most {
        let step = start.min(64 << 10);
        start -= step;
        let mut block = vec![0u8; step as usize];
        if file.seek(SeekFrom::Start(start)).is_err() || file.read_exact(&mut block).is_err() {
            break;
        }
        newlines += block.iter().filter(|&&b| b == b'\n').count();
        blocks.push(block);
    }
    blocks.reverse();
    let buf = blocks.concat();
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // A first line cut by the block's start is dropped with those before
    // the last n; it stays only where the reading stopped at its most,
    // the end of a line longer than that.
    let skip = lines.len().saturating_sub(n);
    (lines.split_off(skip), len)
}

/// The whole lines written to a file past `pos`, moving `pos` past them;
/// a file shorter than `pos` was rotated (copied away and truncated), and
/// is read again from its start.
pub fn new_lines(path: &str, pos: &mut u64) -> Vec<String> {
    let Ok(mut file) = std::fs::File::open(path) else { return Vec::new() };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len < *pos {
        *pos = 0;
    }
    if len == *pos || file.seek(SeekFrom::Start(*pos)).is_err() {
        return Vec::new();
    }
    let mut lines = Vec::new();
    let mut reader = std::io::BufReader::new(file.take(len - *pos));
    let mut line = Vec::new();
    while let Ok(n) = reader.read_until(b'\n', &mut line) {
        if n == 0 || line.last() != Some(&b'\n') {
            break; // a line still being written waits for its end
        }
        *pos += n as u64;
        lines.push(String::from_utf8_lossy(&line[..n - 1]).into_owned());
        line.clear();
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_and_what_comes_after_it() {
        let tmp_dir = tempfile::tempdir().unwrap();
        let dir = tmp_dir.path().to_path_buf();
        let path = dir.join("a.log");
        let text: String = (1..=100_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, &text).unwrap();
        let p = path.to_str().unwrap();
        let (lines, end) = last_lines(p, 3);
        assert_eq!(lines, vec!["line 99998", "line 99999", "line 100000"]);
        assert_eq!(end, text.len() as u64);
        let mut pos = end;
        assert!(new_lines(p, &mut pos).is_empty());
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"next\npart").unwrap();
        assert_eq!(new_lines(p, &mut pos), vec!["next"], "a line still being written waits");
        std::fs::write(&path, "after rotation\n").unwrap();
        assert_eq!(new_lines(p, &mut pos), vec!["after rotation"], "a rotated log is read from its start");
        assert_eq!(last_lines(p, 0).0, Vec::<String>::new());
        assert_eq!(last_lines("/nonexistent/x.log", 5).0, Vec::<String>::new());
    }

    #[test]
    fn the_tail_of_a_log_with_a_huge_line_is_read_from_its_end_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.log");
        let mut text = b"first\n".to_vec();
        text.extend(std::iter::repeat_n(b'B', 50 << 20));
        text.extend(b"\nlast\n");
        std::fs::write(&path, &text).unwrap();
        let (lines, end) = last_lines(path.to_str().unwrap(), 2);
        assert_eq!(end, text.len() as u64);
        assert_eq!(lines.len(), 2, "the end of the huge line, then the last");
        // Read from the end, at most n + 2 blocks of 64 KiB: not the whole line.
        assert!(lines[0].bytes().all(|b| b == b'B') && lines[0].len() <= 4 << 16, "{}", lines[0].len());
        assert_eq!(lines[1], "last");
    }
}
