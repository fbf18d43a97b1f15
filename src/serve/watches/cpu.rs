//! The CPU percent of each running copy, as `pm2 list` shows it: a task
//! reads every copy's CPU time (its process tree's) every
//! [`SAMPLE_EVERY`], off the daemon's lock, and keeps the share of one core
//! each used since the reading before. `status` and the metrics read the
//! last figures; they never wait for a reading.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::sys::procfs::Processes;

use crate::serve::Shared;

/// How often the copies' CPU time is read.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// A process as recorded: its PID and start time.
type Key = (u32, u64);

/// Each running copy's CPU percent over the last [`SAMPLE_EVERY`], by its
/// launcher's (PID, start time): 100 is one core's worth.
#[derive(Debug, Default, Clone)]
pub struct CpuPercent(HashMap<Key, f64>);

impl CpuPercent {
    /// The figure of the process `pid` started at `start`; `None` before it
    /// has been read twice.
    pub fn get(&self, pid: u32, start: Option<u64>) -> Option<f64> {
        self.0.get(&(pid, start?)).copied()
    }
}

/// The share of one core used between two readings of CPU seconds taken
/// `elapsed` apart, as a percent rounded to a tenth; `None` for readings
/// too close together to tell.
pub fn percent(before: f64, after: f64, elapsed: Duration) -> Option<f64> {
    let secs = elapsed.as_secs_f64();
    (secs >= 0.5).then(|| ((after - before).max(0.0) / secs * 1000.0).round() / 10.0)
}

/// Starts the task that reads the copies' CPU time and memory, and the
/// pool's memory through `pool_memory` (given by the caller: the pool is
/// `serve::copies`' and the copies' room uses this one).
pub fn spawn_sampler(shared: Shared, pool_memory: fn() -> u64) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SAMPLE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: HashMap<Key, (f64, Instant)> = HashMap::new();
        loop {
            every.tick().await;
            let running: Vec<Key> = {
                let d = shared.lock();
                d.apps.values().flat_map(|a| a.recorded.state.copies.iter()).filter_map(|r| Some((r.pid?, r.pid_start?))).collect()
            };
            let read = tokio::task::spawn_blocking(move || {
                let processes = (!running.is_empty()).then(Processes::read);
                let at = Instant::now();
                // Each copy's memory too, from the same scan (its
                // proportional share, ~1 ms an R process, so here every 5 s
                // and not in each status): status's MEM and the memory
                // bound on growth read it.
                let mem: HashMap<u32, u64> = running.iter().filter_map(|k| Some((k.0, processes.as_ref()?.tree_mem_bytes(k.0)?))).collect();
                let cpu = running.into_iter().filter_map(|k| Some((k, processes.as_ref()?.tree_cpu_secs(k.0)?, at))).collect::<Vec<_>>();
                (cpu, mem, pool_memory())
            });
            let Ok((readings, mem, pool_mem)) = read.await else { continue };
            let mut figures = HashMap::new();
            for (key, secs, at) in &readings {
                if let Some(p) = last.get(key).and_then(|(was, then)| percent(*was, *secs, at.duration_since(*then))) {
                    figures.insert(*key, p);
                }
            }
            // Only processes still running are kept: a PID reused later is
            // another start time, another key.
            last = readings.into_iter().map(|(k, s, at)| (k, (s, at))).collect();
            let mut d = shared.lock();
            d.cpu_percent = CpuPercent(figures);
            d.copy_mem = mem;
            d.pool_mem = pool_mem;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_percent_is_of_one_core_over_the_time_between_readings() {
        assert_eq!(percent(10.0, 12.5, Duration::from_secs(5)), Some(50.0));
        assert_eq!(percent(10.0, 20.0, Duration::from_secs(5)), Some(200.0), "two cores busy");
        assert_eq!(percent(10.0, 10.0, Duration::from_secs(5)), Some(0.0));
        assert_eq!(percent(10.0, 9.0, Duration::from_secs(5)), Some(0.0), "a child that left the tree takes its time with it");
        assert_eq!(percent(1.0, 2.0, Duration::from_millis(10)), None, "too close together");
        let mut figures = CpuPercent::default();
        figures.0.insert((7, 100), 12.5);
        assert_eq!(figures.get(7, Some(100)), Some(12.5));
        assert_eq!(figures.get(7, Some(101)), None, "another start time is another process");
        assert_eq!(figures.get(7, None), None);
    }
}
