//! What the driver reads of the machine and of its own process, through `procfs` on
//! Linux (`None` or a plain default elsewhere): load, memory, context switches, the
//! CPU's model. One place, so that no workload parses `/proc` by hand.

#![forbid(unsafe_code)]

#[cfg(target_os = "linux")]
use procfs::{process::Process, Current, CurrentSI};

/// The 1-minute load average.
pub(crate) fn load_average() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        procfs::LoadAverage::current()
            .ok()
            .map(|load| f64::from(load.one))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// CPU seconds the whole machine has been busy since boot (every process on every
/// CPU), and its CPUs: the CPUs × the uptime, less their idle time (/proc/uptime,
/// 10 ms resolution). Idle time is measured, not sampled; /proc/stat's busy columns
/// are sampled at the scheduler tick and, on a tickless kernel, can miss most of a
/// load that sleeps and wakes every few hundred µs.
pub(crate) fn machine_busy() -> Option<(f64, usize)> {
    #[cfg(target_os = "linux")]
    {
        let cpus = procfs::KernelStats::current().ok()?.cpu_time.len().max(1);
        let uptime = procfs::Uptime::current().ok()?;
        Some((cpus as f64 * uptime.uptime - uptime.idle, cpus))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Resets the process's peak resident set (VmHWM) to its current one (Linux 4.0+).
/// Written by hand: `procfs`'s `ClearRefs` has no value 5 ("reset the peak").
pub(crate) fn reset_peak_rss() {
    #[cfg(target_os = "linux")]
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set (VmHWM) since start or the last [`reset_peak_rss`], bytes.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        Process::myself()
            .ok()?
            .status()
            .ok()?
            .vmhwm
            .map(|kib| kib * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Resident set now (VmRSS), bytes.
pub(crate) fn rss_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        Process::myself()
            .ok()?
            .status()
            .ok()?
            .vmrss
            .map(|kib| kib * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The threads of this process whose names start with `prefix`, and their context
/// switches (voluntary and not) so far.
pub(crate) fn context_switches(prefix: &str) -> Option<(usize, u64)> {
    #[cfg(target_os = "linux")]
    {
        let mut threads = 0;
        let mut switches = 0;
        for task in Process::myself().ok()?.tasks().ok()? {
            let Ok(status) = task.and_then(|task| task.status()) else {
                continue; // the thread exited meanwhile
            };
            if !status.name.starts_with(prefix) {
                continue;
            }
            threads += 1;
            switches += status.voluntary_ctxt_switches? + status.nonvoluntary_ctxt_switches?;
        }
        Some((threads, switches))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = prefix;
        None
    }
}

/// The CPU's model name, or "unknown".
pub(crate) fn cpu_model() -> String {
    #[cfg(target_os = "linux")]
    if let Some(model) = procfs::CpuInfo::current()
        .ok()
        .and_then(|info| info.model_name(0).map(str::to_owned))
    {
        return model;
    }
    "unknown".into()
}

/// The kernel's release ("Linux 6.1.0-…", from /proc/sys/kernel/osrelease, a plain
/// string), or the OS's name.
pub(crate) fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|release| format!("Linux {}", release.trim()))
        .unwrap_or_else(|_| std::env::consts::OS.to_owned())
}

/// Watches each CPU for the machine's own stalls over a workload: one thread pinned
/// to each CPU sleeps [`StallProbe::NAP`] at a time and records how much later than
/// asked it woke, less the time it then waited on its CPU's run queue (its
/// `schedstat` run delay). What is left is time the CPU gave no thread of this
/// machine's kernel a chance to wake it: the virtual CPU descheduled by the host, or
/// interrupts held off. Time a thread of ours (or anybody's) kept the CPU is run
/// delay and is not counted, so a shard that hogs its core is not excused by this.
///
/// Found on the 2-core VM (issue 41, item 6): a thread spinning on each CPU of the
/// otherwise idle machine lost its CPU for 5–12 ms several times in 20 s, and a
/// system-wide trace of a late `keepalive` expiry showed neither CPU switching any
/// thread for 8 ms while timers were due, then every hrtimer of the gap expiring at
/// once.
pub(crate) struct StallProbe {
    /// Set to stop the probe threads.
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The probe threads; each returns the longest stall it saw, µs.
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<u64>>>,
}

impl StallProbe {
    /// How long a probe sleeps between looks.
    pub(crate) const NAP: std::time::Duration = std::time::Duration::from_millis(1);

    /// Starts a probe thread on each CPU (Linux; elsewhere none, and
    /// [`longest_us`](Self::longest_us) is `None`).
    pub(crate) fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut threads = Vec::new();
        #[cfg(target_os = "linux")]
        for core in core_affinity::get_core_ids().unwrap_or_default() {
            let stop = stop.clone();
            let spawned = std::thread::Builder::new()
                .name("stall-probe".into())
                .spawn(move || {
                    if !core_affinity::set_for_current(core) {
                        return 0;
                    }
                    probe_stalls(&stop)
                });
            if let Ok(thread) = spawned {
                threads.push(thread);
            }
        }
        StallProbe {
            stop,
            threads: std::sync::Mutex::new(threads),
        }
    }

    /// Stops the probe threads and returns the longest stall any CPU saw, µs; `None`
    /// where nothing was probed.
    pub(crate) fn longest_us(&self) -> Option<u64> {
        // ORDERING: Relaxed: the join below orders everything the threads did.
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        if threads.is_empty() {
            return None;
        }
        threads
            .into_iter()
            .map(|thread| thread.join().ok())
            .max()
            .flatten()
    }
}

impl Drop for StallProbe {
    fn drop(&mut self) {
        // ORDERING: Relaxed: the threads only need to see it eventually.
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A probe thread's loop ([`StallProbe`]): the longest stall it saw, µs.
#[cfg(target_os = "linux")]
fn probe_stalls(stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::os::unix::fs::FileExt;
    let Ok(schedstat) = std::fs::File::open("/proc/thread-self/schedstat") else {
        return 0;
    };
    // The second field: ns this thread spent runnable, waiting for its CPU.
    let run_delay = || {
        let mut text = [0u8; 128];
        let read = schedstat.read_at(&mut text, 0).ok()?;
        let text = std::str::from_utf8(&text[..read]).ok()?;
        text.split_whitespace().nth(1)?.parse::<u64>().ok()
    };
    let mut longest = 0;
    // ORDERING: Relaxed: a stop flag; nothing is read through it.
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let (Some(waited_before), asked) =
            (run_delay(), std::time::Instant::now() + StallProbe::NAP)
        else {
            return longest;
        };
        std::thread::sleep(StallProbe::NAP);
        let late = asked.elapsed().as_nanos() as u64;
        let waited = run_delay().map_or(late, |after| after.saturating_sub(waited_before));
        longest = longest.max(late.saturating_sub(waited) / 1_000);
    }
    longest
}
