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
